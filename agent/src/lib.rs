//! # seqstream-agent
//!
//! The runtime every seqstream role runs on, modelled on Aeron's media driver and Agrona. A
//! role (sequencer, compositor, replication, forwarder) is an [`Agent`]: a duty cycle that
//! never blocks. Where it runs is its host's choice: an [`AgentRunner`] gives an agent (or a
//! [`CompositeAgent`] of several) a thread, a core, an idle strategy and an error policy; an
//! [`AgentInvoker`] drives one from the caller's thread (applications, tests).
//!
//! This crate owns the runtime and what every daemon shares, and nothing of any role: it knows
//! no store, no socket and no message format.
//!
//! | module | owns |
//! |---|---|
//! | [`agent`] | the [`Agent`] contract, [`CompositeAgent`] and the [`AgentSink`] that hands it agents |
//! | [`runner`] | [`AgentRunner`]: thread, pinning, idling, the per-cycle clock, error policy |
//! | [`host`] | [`host::Layout`]: a host's roles on threads (dedicated, shared, thread groups) |
//! | [`invoker`] | [`AgentInvoker`]: duty cycles on the caller's thread |
//! | [`idle`] | idle strategies (busy-spin, yield, backoff, sleep) |
//! | [`affinity`] | core pinning |
//! | [`spinners`] | the process's busy-spinning threads; a WARN when they outnumber their cores |
//! | [`clock`] | realtime and monotonic time as an input; a manual clock for tests |
//! | [`counters`] | the shared-memory counters file every daemon publishes (`seqstat` reads it) |
//! | [`gate`] | [`LeaderGate`]: whether a sequencer group's node may act as leader now |
//! | [`ratelimit`] | rate limits of repeated log lines |
//! | `daemon` (feature `daemon`) | config files, SIGINT/SIGTERM, logging, counters paths |

pub mod affinity;
pub mod agent;
pub mod clock;
pub mod counters;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod gate;
pub mod host;
pub mod idle;
pub mod invoker;
pub mod ratelimit;
pub mod runner;
pub mod spinners;

pub use agent::{
    run_cycle, Agent, AgentError, AgentSink, CompositeAgent, DutyCycle, Housekeeping,
    HOUSEKEEPING_EVERY_NS,
};
pub use gate::LeaderGate;
pub use idle::{Idle, IdleState, IdleStrategy};
pub use invoker::AgentInvoker;
pub use runner::{AgentRunner, OnError, RunnerConfig, RunnerError};
