//! What the tools' binaries share (`make bench` and `make peers`): CPU time read off /proc, Redis'
//! script calls, the machine a run measured on, medians, and the Envoy configurations both render. Every reader here
//! only reads; a reading that fails counts as zero, so a figure shows it rather than a run being lost.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod commandstats;
pub mod configs;
pub mod cpu;
pub mod machine;
pub mod median;
