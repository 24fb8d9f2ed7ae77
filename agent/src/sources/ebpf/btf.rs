//! Reads struct member offsets from kernel BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF programs have no CO-RE field relocations, so the agent looks up the offsets it needs
//! (e.g. `task_struct.pid`) here and patches them into the programs as globals before loading.
//! aya-obj parses BTF too, but keeps its type accessors private; this is the small subset needed:
//! find a named struct, then a named member, descending into anonymous structs and unions.
//!
//! Needs a kernel built with `CONFIG_DEBUG_INFO_BTF=y` (5.4+; every mainstream distro kernel).

use std::{collections::HashMap, path::Path};

use slo_probe_common::{SchedOffsets, SockOffsets};

/// Where the running kernel exposes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// Errors reading BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error(
        "cannot read kernel BTF at {path}: {source}; the scheduling probes need a kernel built \
         with CONFIG_DEBUG_INFO_BTF=y (or pass --no-ebpf)"
    )]
    Read {
        /// The path tried.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The data is not BTF or is cut short.
    #[error("malformed BTF: {what}")]
    Malformed {
        /// What was wrong.
        what: &'static str,
    },
    /// The struct is not in the BTF.
    #[error("kernel BTF has no struct {name}")]
    NoStruct {
        /// Struct name.
        name: String,
    },
    /// The member is not in the struct.
    #[error("kernel BTF struct {strukt} has no member {member}")]
    NoMember {
        /// Struct name.
        strukt: String,
        /// Member name.
        member: String,
    },
    /// The member is a bitfield, which the programs cannot read with a byte offset.
    #[error("kernel BTF member {strukt}.{member} is a bitfield")]
    Bitfield {
        /// Struct name.
        strukt: String,
        /// Member name.
        member: String,
    },
}

#[derive(Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
    bitfield_size: u32,
}

enum Type {
    /// Struct or union: its members.
    Composite {
        name_off: u32,
        members: Vec<Member>,
    },
    /// Typedef: its name and target.
    Typedef {
        name_off: u32,
        target: u32,
    },
    /// Pointer: its target.
    Ptr {
        target: u32,
    },
    /// Function prototype: its parameter count.
    FuncProto {
        params: u32,
    },
    Other,
}

/// Parsed kernel BTF: the struct and union types, by id.
pub struct Btf {
    strings: Vec<u8>,
    /// types[id - 1]
    types: Vec<Type>,
    structs_by_name: HashMap<String, u32>,
    typedefs_by_name: HashMap<String, u32>,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32, BtfError> {
        let b = self
            .data
            .get(self.pos..self.pos + 4)
            .ok_or(BtfError::Malformed {
                what: "type section cut short",
            })?;
        self.pos += 4;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn skip(&mut self, n: usize) -> Result<(), BtfError> {
        if self.pos + n > self.data.len() {
            return Err(BtfError::Malformed {
                what: "type section cut short",
            });
        }
        self.pos += n;
        Ok(())
    }
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    /// Reads BTF from a file.
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses raw (little-endian) BTF.
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let word = |at: usize| -> Result<u32, BtfError> {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(BtfError::Malformed {
                    what: "header cut short",
                })
        };
        let magic = data.get(..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        if magic != Some(BTF_MAGIC) {
            return Err(BtfError::Malformed {
                what: "bad magic (not little-endian BTF)",
            });
        }
        let hdr_len = word(4)? as usize;
        let type_off = word(8)? as usize;
        let type_len = word(12)? as usize;
        let str_off = word(16)? as usize;
        let str_len = word(20)? as usize;
        let section = |off: usize, len: usize| {
            hdr_len
                .checked_add(off)
                .and_then(|start| Some((start, start.checked_add(len)?)))
                .and_then(|(start, end)| data.get(start..end))
                .ok_or(BtfError::Malformed {
                    what: "section outside the data",
                })
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();

        let mut r = Reader {
            data: type_data,
            pos: 0,
        };
        let mut types = Vec::new();
        while r.pos < type_data.len() {
            let name_off = r.u32()?;
            let info = r.u32()?;
            let size_or_type = r.u32()?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for _ in 0..vlen {
                        let name_off = r.u32()?;
                        let type_id = r.u32()?;
                        let offset = r.u32()?;
                        let (bit_offset, bitfield_size) = if kind_flag {
                            (offset & 0x00ff_ffff, offset >> 24)
                        } else {
                            (offset, 0)
                        };
                        members.push(Member {
                            name_off,
                            type_id,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                    Type::Composite { name_off, members }
                }
                KIND_INT | KIND_VAR | KIND_DECL_TAG => {
                    r.skip(4)?;
                    Type::Other
                }
                KIND_ARRAY => {
                    r.skip(12)?;
                    Type::Other
                }
                KIND_ENUM => {
                    r.skip(8 * vlen)?;
                    Type::Other
                }
                KIND_FUNC_PROTO => {
                    r.skip(8 * vlen)?;
                    Type::FuncProto {
                        params: vlen as u32,
                    }
                }
                KIND_DATASEC | KIND_ENUM64 => {
                    r.skip(12 * vlen)?;
                    Type::Other
                }
                KIND_PTR => Type::Ptr {
                    target: size_or_type,
                },
                KIND_TYPEDEF => Type::Typedef {
                    name_off,
                    target: size_or_type,
                },
                // FWD, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG: no tail.
                7 | 9 | 10 | 11 | 12 | 16 | 18 => Type::Other,
                _ => {
                    return Err(BtfError::Malformed {
                        what: "unknown type kind",
                    })
                }
            };
            types.push(ty);
        }

        let mut btf = Self {
            strings,
            types,
            structs_by_name: HashMap::new(),
            typedefs_by_name: HashMap::new(),
        };
        let mut structs = HashMap::new();
        let mut typedefs = HashMap::new();
        for (i, ty) in btf.types.iter().enumerate() {
            let (map, name_off) = match ty {
                Type::Composite { name_off, .. } => (&mut structs, *name_off),
                Type::Typedef { name_off, .. } => (&mut typedefs, *name_off),
                _ => continue,
            };
            if name_off != 0 {
                // Keep the first definition, as libbpf does for duplicate names.
                map.entry(btf.string(name_off).to_owned())
                    .or_insert(i as u32 + 1);
            }
        }
        btf.structs_by_name = structs;
        btf.typedefs_by_name = typedefs;
        Ok(btf)
    }

    fn string(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        (id as usize).checked_sub(1).and_then(|i| self.types.get(i))
    }

    /// Number of arguments of BTF tracepoint `name` (what a `tp_btf` program may read), from
    /// the kernel's `btf_trace_<name>` typedef: a pointer to a prototype whose first parameter
    /// is the tracepoint's private data.
    pub fn tracepoint_args(&self, name: &str) -> Option<u32> {
        let id = *self.typedefs_by_name.get(&format!("btf_trace_{name}"))?;
        let Some(Type::Typedef { target, .. }) = self.ty(id) else {
            return None;
        };
        let Some(Type::Ptr { target }) = self.ty(*target) else {
            return None;
        };
        match self.ty(*target) {
            Some(Type::FuncProto { params }) => params.checked_sub(1),
            _ => None,
        }
    }

    /// Byte offset of `strukt.member`, looking through anonymous struct and union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs_by_name
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct {
                name: strukt.to_owned(),
            })?;
        let bits = self
            .find_member(id, member, 0, 0)?
            .ok_or_else(|| BtfError::NoMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })?;
        if bits % 8 != 0 {
            return Err(BtfError::Bitfield {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        Ok(bits / 8)
    }

    /// Bit offset of `member` within type `id` (plus `base`), searching anonymous members.
    fn find_member(
        &self,
        id: u32,
        member: &str,
        base: u32,
        depth: u32,
    ) -> Result<Option<u32>, BtfError> {
        // Real kernels nest anonymous members a few levels deep; a cycle means corrupt BTF.
        if depth > 16 {
            return Err(BtfError::Malformed {
                what: "anonymous members nested too deep",
            });
        }
        let Some(Type::Composite { members, .. }) = self.ty(id) else {
            return Ok(None);
        };
        for m in members {
            if m.name_off != 0 {
                if self.string(m.name_off) == member {
                    if m.bitfield_size != 0 {
                        return Err(BtfError::Bitfield {
                            strukt: String::new(),
                            member: member.to_owned(),
                        });
                    }
                    return Ok(Some(base + m.bit_offset));
                }
            } else if m.type_id != 0 {
                // Anonymous member: look inside (through modifiers it cannot have in C).
                let found = self.find_member(m.type_id, member, base + m.bit_offset, depth + 1)?;
                if let Some(found) = found {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }
}

/// Offsets of the `task_struct` fields the programs read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `task_struct.pid` (thread id).
    pub pid: u32,
    /// `task_struct.tgid` (process id).
    pub tgid: u32,
    /// `task_struct.comm`.
    pub comm: u32,
}

impl TaskOffsets {
    /// Looks the offsets up in `btf`.
    pub fn from_btf(btf: &Btf) -> Result<Self, BtfError> {
        Ok(Self {
            pid: btf.member_offset("task_struct", "pid")?,
            tgid: btf.member_offset("task_struct", "tgid")?,
            comm: btf.member_offset("task_struct", "comm")?,
        })
    }
}

/// Where `sched_switch` reads the scheduler's run-queue stamps (see [`SchedOffsets`]); an error
/// names the first field this kernel's BTF lacks (no `CONFIG_SCHED_INFO` or
/// `CONFIG_FAIR_GROUP_SCHED`), and the wakeup programs stamp waits instead.
pub fn sched_offsets(btf: &Btf) -> Result<SchedOffsets, BtfError> {
    let sched_info = btf.member_offset("task_struct", "sched_info")?;
    let se = btf.member_offset("task_struct", "se")?;
    Ok(SchedOffsets {
        enabled: 1,
        last_queued: sched_info + btf.member_offset("sched_info", "last_queued")?,
        run_delay: sched_info + btf.member_offset("sched_info", "run_delay")?,
        se_cfs_rq: se + btf.member_offset("sched_entity", "cfs_rq")?,
        cfs_rq_rq: btf.member_offset("cfs_rq", "rq")?,
        rq_clock: btf.member_offset("rq", "clock")?,
    })
}

/// The network programs' kernel offsets (see [`SockOffsets`]).
pub fn sock_offsets(btf: &Btf) -> Result<SockOffsets, BtfError> {
    let sc = |m| btf.member_offset("sock_common", m);
    Ok(SockOffsets {
        daddr: sc("skc_daddr")?,
        rcv_saddr: sc("skc_rcv_saddr")?,
        dport: sc("skc_dport")?,
        num: sc("skc_num")?,
        family: sc("skc_family")?,
        state: sc("skc_state")?,
        v6_daddr: sc("skc_v6_daddr")?,
        v6_rcv_saddr: sc("skc_v6_rcv_saddr")?,
        skb_cb: btf.member_offset("sk_buff", "cb")?,
        tcp_gso_segs: btf.member_offset("tcp_skb_cb", "tcp_gso_segs")?,
        retransmit_has_err: u32::from(btf.tracepoint_args("tcp_retransmit_skb") == Some(3)),
        protocol: btf.member_offset("sock", "sk_protocol")?,
        total_retrans: btf.member_offset("tcp_sock", "total_retrans")?,
        srtt_us: btf.member_offset("tcp_sock", "srtt_us")?,
        snd_cwnd: btf.member_offset("tcp_sock", "snd_cwnd")?,
        _pad: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: `struct outer { int a; union { int b; int c; }; char name[16]; }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0name\0";
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .expect("string") as u32
                + 1
        };
        let mut types: Vec<u32> = Vec::new();
        // 1: int (INT, size 4)
        types.extend([s("int"), KIND_INT << 24, 4, 32]);
        // 2: anonymous union { int b; int c; }
        types.extend([0, (KIND_UNION << 24) | 2, 4]);
        types.extend([s("b"), 1, 0, s("c"), 1, 0]);
        // 3: char[16] (ARRAY)
        types.extend([0, KIND_ARRAY << 24, 0, 1, 1, 16]);
        // 4: struct outer { int a @0; union @32; char name[16] @64 }
        types.extend([s("outer"), (KIND_STRUCT << 24) | 3, 24]);
        types.extend([s("a"), 1, 0, 0, 2, 32, s("name"), 3, 64]);
        let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(BTF_MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        out.extend(24u32.to_le_bytes()); // hdr_len
        out.extend(0u32.to_le_bytes()); // type_off
        out.extend((type_bytes.len() as u32).to_le_bytes());
        out.extend((type_bytes.len() as u32).to_le_bytes()); // str_off
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let btf = Btf::parse(&blob()).expect("parse");
        assert_eq!(btf.member_offset("outer", "a").expect("a"), 0);
        assert_eq!(btf.member_offset("outer", "b").expect("b"), 4);
        assert_eq!(btf.member_offset("outer", "c").expect("c"), 4);
        assert_eq!(btf.member_offset("outer", "name").expect("name"), 8);
        assert!(matches!(
            btf.member_offset("outer", "zz"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("inner", "a"),
            Err(BtfError::NoStruct { .. })
        ));
    }

    #[test]
    fn rejects_malformed() {
        let good = blob();
        for cut in [0, 3, 10, 24, good.len() - 1] {
            assert!(Btf::parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = good.clone();
        bad[0] = 0;
        assert!(matches!(Btf::parse(&bad), Err(BtfError::Malformed { .. })));
    }

    /// The running kernel's BTF (readable without privileges where it exists).
    #[test]
    fn running_kernel_task_struct() {
        let Ok(btf) = Btf::from_sys_fs() else {
            eprintln!("skipped: {VMLINUX_BTF} not readable on this kernel");
            return;
        };
        let off = TaskOffsets::from_btf(&btf).expect("task_struct offsets");
        assert!(off.pid > 0 && off.tgid == off.pid + 4, "{off:?}");
        assert!(off.comm > off.tgid, "{off:?}");
        let sock = sock_offsets(&btf).expect("sock offsets");
        // seq and end_seq come first in tcp_skb_cb; the address pair opens sock_common.
        assert_eq!(sock.tcp_gso_segs, 8, "{sock:?}");
        assert_eq!((sock.daddr, sock.rcv_saddr), (0, 4), "{sock:?}");
        // sched_info's stamps are unsigned long long, in the order the kernel declares them.
        let sched = sched_offsets(&btf).expect("scheduler stamps (CONFIG_SCHED_INFO)");
        assert!(sched.last_queued > sched.run_delay, "{sched:?}");
        assert!(sched.rq_clock > 0 && sched.se_cfs_rq > 0, "{sched:?}");
        assert_eq!(btf.tracepoint_args("sched_switch"), Some(4));
        assert_eq!(btf.tracepoint_args("sched_wakeup"), Some(1));
        assert_eq!(btf.tracepoint_args("no_such_tracepoint"), None);
        // The TCP programs are BTF tracepoints too: each needs its btf_trace_ type.
        for (tp, args) in [
            ("sock_send_length", 3),
            ("sock_recv_length", 3),
            ("inet_sock_set_state", 3),
            ("tcp_probe", 2),
        ] {
            assert_eq!(btf.tracepoint_args(tp), Some(args), "{tp}");
        }
        assert!(
            sock.total_retrans > sock.protocol && sock.srtt_us > 0,
            "{sock:?}"
        );
    }
}
