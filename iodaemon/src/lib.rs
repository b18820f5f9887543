//! The application-side publish API (the outbox) and the host daemon's forwarding loop that
//! drains outboxes to the sequencers over UDP and confirms messages from the sequenced stream.
//!
//! | module | owns |
//! |---|---|
//! | [`outbox`] | the shared-memory ring an application offers unsequenced messages into |
//! | [`cli`] | the forwarder role's options (daemon flags, `seqstreamd` table keys) and its building |
//! | [`forwarder`] | the iodaemon's duty cycle: outboxes → datagrams, confirm, resend |

pub mod cli;
pub mod forwarder;
pub mod outbox;
