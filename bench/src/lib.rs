//! The library half of the `bench` package: what the benchmarks' binaries and tests share.
//! The benchmarks themselves are the `bench` binary (`src/main.rs`).

pub mod certs;
pub mod mdp3;
pub mod paths;
