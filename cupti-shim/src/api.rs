//! The CUPTI functions the shim calls, resolved with `dlsym` from the libcupti already loaded in
//! the process (PyTorch links `libcupti.so.13` from `site-packages/nvidia/cu13/lib`): a second
//! copy loaded from elsewhere would split CUPTI's state (shared/research/cupti.md §3). Types come
//! from cudarc's CUDA 13.0 bindings; enum-typed values cross the boundary as raw integers, since
//! an unknown C enum value in a Rust enum is undefined behaviour.
//!
//! Needs CUPTI 13 (CUDA 13.0, driver 580+).

use std::ffi::{c_char, c_void, CStr};

use crate::error::{CuptiStatus, ShimError};

/// `CUptiResult` as a raw integer.
pub type CuptiResult = u32;
/// `CUPTI_SUCCESS`.
pub const CUPTI_SUCCESS: CuptiResult = 0;
/// `CUPTI_ERROR_MAX_LIMIT_REACHED`: no more records in a buffer.
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: CuptiResult = 12;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`.
pub const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS: CuptiResult = 39;

/// `CUpti_CallbackFunc` with raw integers for the domain and callback id.
pub type CallbackFn =
    unsafe extern "C" fn(userdata: *mut c_void, domain: u32, cbid: u32, data: *const c_void);
/// `CUpti_BuffersCallbackRequestFunc`.
pub type BufferRequestedFn =
    unsafe extern "C" fn(buffer: *mut *mut u8, size: *mut usize, max_num_records: *mut usize);
/// `CUpti_BuffersCallbackCompleteFunc`.
pub type BufferCompletedFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
);
/// `CUpti_TimestampCallbackFunc`.
pub type TimestampFn = unsafe extern "C" fn() -> u64;

macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// Function pointers into the loaded libcupti.
        #[allow(non_snake_case, reason = "the C names")]
        pub struct Cupti {
            $(
                /// The C function of the same name.
                pub $name: unsafe extern "C" fn($($arg),*) -> $ret,
            )*
            /// Functions the shim can do without.
            pub optional: Optional,
        }

        impl Cupti {
            /// Resolves every function from `handle`.
            ///
            /// # Safety
            /// `handle` must be a live `dlopen` handle of libcupti 13.
            unsafe fn resolve(handle: *mut c_void) -> Result<Self, ShimError> {
                Ok(Self {
                    $(
                        $name: {
                            let sym = concat!(stringify!($name), "\0");
                            // SAFETY: a NUL-terminated name and a live handle.
                            let Some(p) = (unsafe { lookup(handle, sym.as_ptr().cast()) }) else {
                                return Err(ShimError::MissingSymbol { symbol: stringify!($name) });
                            };
                            // SAFETY: the symbol is the C function with this signature (CUPTI 13
                            // headers).
                            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                        },
                    )*
                    // SAFETY: as above.
                    optional: unsafe { Optional::resolve(handle) },
                })
            }
        }
    };
}

/// `cuptiActivityFlushPeriod(uint32_t ms)`.
pub type FlushPeriodFn = unsafe extern "C" fn(u32) -> CuptiResult;
/// `cuptiActivitySetAttribute(CUpti_ActivityAttribute, size_t *size, void *value)`.
pub type SetAttributeFn = unsafe extern "C" fn(u32, *mut usize, *mut c_void) -> CuptiResult;

/// CUPTI functions the shim uses where the library has them and does without otherwise.
#[derive(Default)]
pub struct Optional {
    /// How often CUPTI's own worker thread flushes (returns full, completed buffers).
    pub flush_period: Option<FlushPeriodFn>,
    /// Activity attributes (the device buffer's size).
    pub set_attribute: Option<SetAttributeFn>,
    /// `cuptiActivityGetAttribute`, same signature: what CUPTI has set.
    pub get_attribute: Option<SetAttributeFn>,
}

/// The address of `name` in `handle`, if it has it.
///
/// # Safety
/// `handle` must be a live `dlopen` handle and `name` a NUL-terminated string.
unsafe fn lookup(handle: *mut c_void, name: *const c_char) -> Option<*mut c_void> {
    // SAFETY: as the caller promises.
    let p = unsafe { libc::dlsym(handle, name) };
    (!p.is_null()).then_some(p)
}

impl Optional {
    /// # Safety
    /// `handle` must be a live `dlopen` handle of libcupti 13.
    unsafe fn resolve(handle: *mut c_void) -> Self {
        // SAFETY: NUL-terminated names and a live handle.
        let find = |sym: &std::ffi::CStr| unsafe { lookup(handle, sym.as_ptr()) };
        Self {
            // SAFETY: the symbols are the C functions with these signatures (CUPTI 13 headers).
            flush_period: find(c"cuptiActivityFlushPeriod")
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, FlushPeriodFn>(p) }),
            // SAFETY: as above.
            set_attribute: find(c"cuptiActivitySetAttribute")
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, SetAttributeFn>(p) }),
            // SAFETY: as above.
            get_attribute: find(c"cuptiActivityGetAttribute")
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, SetAttributeFn>(p) }),
        }
    }
}

api! {
    cuptiGetVersion: fn(*mut u32) -> CuptiResult;
    cuptiGetResultString: fn(CuptiResult, *mut *const c_char) -> CuptiResult;
    cuptiSubscribe: fn(*mut *mut c_void, CallbackFn, *mut c_void) -> CuptiResult;
    cuptiUnsubscribe: fn(*mut c_void) -> CuptiResult;
    cuptiEnableCallback: fn(u32, *mut c_void, u32, u32) -> CuptiResult;
    cuptiEnableDomain: fn(u32, *mut c_void, u32) -> CuptiResult;
    cuptiActivityEnable: fn(u32) -> CuptiResult;
    cuptiActivityDisable: fn(u32) -> CuptiResult;
    cuptiActivityRegisterCallbacks: fn(BufferRequestedFn, BufferCompletedFn) -> CuptiResult;
    cuptiActivityRegisterTimestampCallback: fn(TimestampFn) -> CuptiResult;
    cuptiActivityFlushAll: fn(u32) -> CuptiResult;
    cuptiActivityGetNextRecord: fn(*mut u8, usize, *mut *mut c_void) -> CuptiResult;
    cuptiActivityGetNumDroppedRecords: fn(*mut c_void, u32, *mut usize) -> CuptiResult;
    cuptiGetGraphNodeId: fn(*mut c_void, *mut u64) -> CuptiResult;
    cuptiGetGraphId: fn(*mut c_void, *mut u32) -> CuptiResult;
}

impl Cupti {
    /// Finds libcupti where a CUDA driver is there: the copy already loaded (`RTLD_NOLOAD`),
    /// else the first one the loader finds by soname.
    pub fn load() -> Result<(Self, &'static str), ShimError> {
        // Without a CUDA driver libcupti is not called at all: CUPTI 13's cuptiGetVersion
        // then recurses through cuptiGetResultString until the stack overflows (a CPU-only
        // node with a CUDA build of PyTorch, whose libcupti is loaded, and the shim loaded by
        // the python client for step markers: the training process died of SIGSEGV at its
        // first step under `slo-probe run`, 2026-12-02). Loading the driver library here only
        // maps it (the first CUDA call initialises it); it stays loaded, as libcupti would
        // load it anyway.
        let driver = [libc::RTLD_NOW | libc::RTLD_NOLOAD, libc::RTLD_LAZY]
            .into_iter()
            // SAFETY: a NUL-terminated name.
            .any(|flags| !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) }.is_null());
        if !driver {
            return Err(ShimError::NoDriver);
        }
        for (name, flags) in [
            (c"libcupti.so.13", libc::RTLD_NOW | libc::RTLD_NOLOAD),
            (c"libcupti.so", libc::RTLD_NOW | libc::RTLD_NOLOAD),
            (c"libcupti.so.13", libc::RTLD_NOW),
        ] {
            // SAFETY: a NUL-terminated name.
            let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
            if !handle.is_null() {
                let how = if flags & libc::RTLD_NOLOAD != 0 {
                    "the copy already loaded in the process"
                } else {
                    "a copy found by the dynamic loader"
                };
                // SAFETY: a live handle of a library named libcupti.
                return unsafe { Self::resolve(handle) }.map(|api| (api, how));
            }
        }
        Err(ShimError::NoLibcupti)
    }

    /// A CUPTI result code with its text.
    pub fn describe(&self, r: CuptiResult) -> CuptiStatus {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: valid out pointer; CUPTI returns a static string.
        let text = (unsafe { (self.cuptiGetResultString)(r, &mut p) } == CUPTI_SUCCESS
            && !p.is_null())
        .then(|| {
            // SAFETY: a NUL-terminated static string from CUPTI.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        });
        CuptiStatus { code: r, text }
    }

    /// `Ok` for `CUPTI_SUCCESS`, else the error of `call`.
    pub fn check(&self, r: CuptiResult, call: impl FnOnce() -> String) -> Result<(), ShimError> {
        if r == CUPTI_SUCCESS {
            Ok(())
        } else {
            Err(ShimError::Cupti {
                call: call(),
                status: self.describe(r),
            })
        }
    }
}
