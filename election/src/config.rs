//! The configuration of one member's election.

use std::time::Duration;

use crate::Error;

/// How one member of a sequencer group takes part in its election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// etcd client URLs (`http://host:port`), any member of the etcd cluster.
    pub endpoints: Vec<String>,
    /// Key prefix of the group, e.g. `/seqstream/orders`: the keys are `<prefix>/leader`,
    /// `<prefix>/term`, `<prefix>/in-sync` and `<prefix>/switchover`.
    pub prefix: String,
    /// This member's node id (unique in the group, `1..=`[`MAX_NODE_ID`](crate::MAX_NODE_ID)).
    pub node_id: u32,
    /// The etcd lease TTL of the leader key: how long a dead leader's key outlives it, so the
    /// bound on unplanned failover. Whole seconds (etcd's unit), at least 1 s. Default 2 s.
    pub lease_ttl: Duration,
    /// How often a leader sends a keep-alive. Default `lease_ttl / 4`.
    pub renew_every: Duration,
    /// How long before its lease could expire a leader stops acting (covers clock-rate
    /// differences and the time between a fence check and the action it guards). Default
    /// `lease_ttl / 10`, at least 50 ms.
    pub fence_margin: Duration,
    /// Time limit of each etcd call and of a connection attempt. Default `lease_ttl / 4`.
    pub call_timeout: Duration,
    /// Wait between attempts when etcd cannot be reached. Default 100 ms.
    pub retry_every: Duration,
    /// How often the etcd connection sends an HTTP/2 ping while a stream (a watch, the
    /// keep-alive) is open, so that a flow dropped without a close fails within a ping's
    /// `call_timeout`. Default 5 s: etcd closes a connection that pings more often than its
    /// `--grpc-keepalive-min-time` (5 s unless set), GOAWAY "too many pings", taking its
    /// watches with it. Lower it only with that flag lowered too. Members do not wait for it
    /// to leave a dead connection: a leader whose renewal fails (each has `call_timeout`)
    /// renews over a new connection, and a standby reads the leader key again every
    /// `lease_ttl` and reconnects when that fails.
    pub ping_every: Duration,
}

impl ElectionConfig {
    /// A member `node_id` of the group at `prefix`, with the default timings.
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>, node_id: u32) -> Self {
        ElectionConfig {
            endpoints,
            prefix: prefix.into(),
            node_id,
            lease_ttl: Duration::from_secs(2),
            renew_every: Duration::from_millis(500),
            fence_margin: Duration::from_millis(200),
            call_timeout: Duration::from_millis(500),
            retry_every: Duration::from_millis(100),
            ping_every: Duration::from_secs(5),
        }
    }

    /// Sets the lease TTL and the timings derived from it (`renew_every`, `fence_margin`,
    /// `call_timeout`), as documented on each field.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self.renew_every = ttl / 4;
        self.fence_margin = (ttl / 10).max(Duration::from_millis(50));
        self.call_timeout = ttl / 4;
        self
    }

    /// Checks that the timings can keep a leader's fence ahead of its lease.
    ///
    /// Errors: `Config` naming the first field that cannot work.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::Config(why));
        if self.endpoints.is_empty() {
            return bad("no etcd endpoint".into());
        }
        if !(1..=crate::MAX_NODE_ID).contains(&self.node_id) {
            return bad(format!(
                "node id {}: from 1 to {} (0 means no leader)",
                self.node_id,
                crate::MAX_NODE_ID
            ));
        }
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            return bad(format!(
                "key prefix {:?}: not empty, no trailing '/'",
                self.prefix
            ));
        }
        if self.lease_ttl.as_secs() == 0 || self.lease_ttl.subsec_nanos() != 0 {
            return bad(format!(
                "lease TTL {:?}: etcd leases are whole seconds, at least 1",
                self.lease_ttl
            ));
        }
        if self.fence_margin >= self.lease_ttl {
            return bad("the fence margin must be shorter than the lease TTL".into());
        }
        if self.renew_every + 2 * self.call_timeout >= self.lease_ttl - self.fence_margin {
            return bad(format!(
                "renew_every {:?} + 2 × call_timeout {:?} (a keep-alive and the check of the \
                 leader key) leave no renewal before the fence lapses ({:?} − {:?})",
                self.renew_every, self.call_timeout, self.lease_ttl, self.fence_margin
            ));
        }
        if self.call_timeout.is_zero() || self.renew_every.is_zero() || self.ping_every.is_zero() {
            return bad("renew_every, call_timeout and ping_every must be above 0".into());
        }
        Ok(())
    }

    pub(crate) fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    pub(crate) fn term_key(&self) -> String {
        format!("{}/term", self.prefix)
    }

    pub(crate) fn in_sync_key(&self) -> String {
        format!("{}/in-sync", self.prefix)
    }

    pub(crate) fn switchover_key(&self) -> String {
        format!("{}/switchover", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_timings_are_refused() {
        let ok = ElectionConfig::new(vec!["http://127.0.0.1:2379".into()], "/g", 1);
        ok.validate().unwrap();
        ok.clone()
            .lease_ttl(Duration::from_secs(1))
            .validate()
            .unwrap();
        for bad in [
            ElectionConfig {
                node_id: 0,
                ..ok.clone()
            },
            ElectionConfig {
                node_id: 65,
                ..ok.clone()
            },
            ElectionConfig {
                endpoints: vec![],
                ..ok.clone()
            },
            ElectionConfig {
                prefix: "/g/".into(),
                ..ok.clone()
            },
            ok.clone().lease_ttl(Duration::from_millis(1500)),
            ElectionConfig {
                renew_every: Duration::from_secs(2),
                ..ok.clone()
            },
            ElectionConfig {
                fence_margin: Duration::from_secs(3),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
