//! Library target of the eBPF crate: empty. It exists so that `agent/` can name the crate as a
//! build-dependency, which makes cargo rebuild the agent when the programs change.
#![no_std]
