//! The application-side publish API (the outbox) and, still to come (issue 4), the host
//! daemon that drains outboxes to the sequencers over UDP and confirms messages from the
//! sequenced stream.
//!
//! | module | owns |
//! |---|---|
//! | [`outbox`] | the shared-memory ring an application offers unsequenced messages into |

pub mod outbox;
