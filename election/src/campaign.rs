//! The `election` thread: one member's conversation with etcd, as a loop of three phases —
//! **follow** (read the leader key; watch it until it is deleted), **campaign** (when there is
//! no leader key and this member is eligible: one transaction that creates the leader key on a
//! fresh lease and raises the term), **lead** (keep the lease alive; move the fence forward
//! only on etcd's acknowledgement of a keep-alive, from the instant that keep-alive was sent).
//!
//! The thread runs a single-threaded tokio runtime because `etcd-client` is async; nothing
//! else in seqstream is. Every etcd call has a time limit (`call_timeout`); a failed call is
//! counted, logged and retried after `retry_every`, and never touches the fence except to
//! close it.
//!
//! A keep-alive stream whose call timed out is dropped, never reused: a late answer on it
//! would be taken for the answer to a later keep-alive and move the fence past the lease.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, PutOptions, Txn, TxnOp, WatchOptions,
};
use seqstream_agent::daemon::LimitedWarn;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};

use crate::config::ElectionConfig;
use crate::fence::{Count, Fence, Role, Shared};
use crate::{Error, LeaderRecord};

/// What the owner asks of the `election` thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    /// Give up a leadership now (the fence closes first), and campaign no more until
    /// [`Election::set_eligible`] says so.
    Resign,
    /// Resign if leading, then end the thread.
    Stop,
}

/// One member's election: the `election` thread and the handle to its state. Dropping it
/// stops the thread; a leader resigns first (its lease is revoked, so the others need not
/// wait for it to expire).
#[derive(Debug)]
pub struct Election {
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedSender<Cmd>,
    thread: Option<JoinHandle<()>>,
}

impl Election {
    /// Validates `cfg` and starts the `election` thread, which connects to etcd and follows
    /// or campaigns. Returns at once; watch [`Fence::role`] and [`Fence::term_if_leading`].
    ///
    /// Errors: `Config` for timings that cannot work ([`ElectionConfig::validate`]); `Spawn`.
    pub fn start(cfg: ElectionConfig) -> Result<Election, Error> {
        cfg.validate()?;
        let shared = Shared::new(cfg.node_id);
        let (cmds, rx) = mpsc::unbounded_channel();
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("election".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a single-threaded tokio runtime");
                rt.block_on(run(cfg, state, rx));
            })
            .map_err(Error::Spawn)?;
        Ok(Election {
            shared,
            cmds,
            thread: Some(thread),
        })
    }

    /// The fence and status of this member.
    pub fn fence(&self) -> Fence {
        Fence(self.shared.clone())
    }

    /// Whether this member may campaign when no leader key exists. Default `false`: a member
    /// must lead only with a store that holds every frame released so far (a deposed leader
    /// that comes back, or a standby behind, would otherwise start a term on a history that
    /// lacks the last term's frames), and only its owner can know that: a standby sets `true`
    /// while it is in sync. It does not end a leadership.
    pub fn set_eligible(&self, eligible: bool) {
        self.shared.eligible.store(eligible, Ordering::Relaxed);
    }

    /// Gives up a leadership at once (the fence closes before the lease is revoked) and stops
    /// campaigning until [`set_eligible(true)`](Self::set_eligible): a planned hand-over.
    pub fn resign(&self) {
        self.shared.eligible.store(false, Ordering::Relaxed);
        let _ = self.cmds.send(Cmd::Resign);
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How a phase ended.
enum Next {
    /// No leader key: campaign if eligible.
    Vacant,
    /// This member won: lead.
    Won(Won),
    /// Stop the thread.
    Stop,
}

/// A won leadership: its lease, its term and the TTL the fence counts with.
struct Won {
    lease: i64,
    term: u32,
    ttl: Duration,
}

/// The thread's body: connect, then follow, campaign and lead until stopped. Failures repeat
/// every `retry_every` while etcd is away: their log lines are rate-limited (the counters
/// keep the exact numbers).
async fn run(cfg: ElectionConfig, shared: Arc<Shared>, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
    let mut client: Option<Client> = None;
    let mut last_lease = None;
    let mut warn_etcd = LimitedWarn::new("etcd");
    let mut warn_keepalive = LimitedWarn::new("keep-alive");
    loop {
        let c = match client.as_mut() {
            Some(c) => c,
            None => match connect(&cfg).await {
                Ok(c) => client.insert(c),
                Err(e) => {
                    shared.count(Count::EtcdError);
                    warn_etcd.warn(format_args!("node {}: cannot reach etcd: {e}", cfg.node_id));
                    shared.set_role(Role::Unknown);
                    if pause(&cfg, &mut cmds).await == Some(Cmd::Stop) {
                        return;
                    }
                    continue;
                }
            },
        };
        let next = match follow(&cfg, &shared, c, &mut cmds, &mut last_lease).await {
            Ok(Next::Vacant) if shared.eligible.load(Ordering::Relaxed) => {
                campaign(&cfg, &shared, c).await
            }
            Ok(Next::Vacant) => {
                shared.set_role(Role::Unknown);
                match pause(&cfg, &mut cmds).await {
                    Some(Cmd::Stop) => Ok(Next::Stop),
                    _ => Ok(Next::Vacant),
                }
            }
            other => other,
        };
        match next {
            Ok(Next::Won(won)) => {
                if lead(&cfg, &shared, c, &mut cmds, won, &mut warn_keepalive).await
                    == Some(Cmd::Stop)
                {
                    return;
                }
            }
            Ok(Next::Vacant) => {}
            Ok(Next::Stop) => return,
            Err(e) => {
                shared.count(Count::EtcdError);
                shared.set_role(Role::Unknown);
                warn_etcd.warn(format_args!("node {}: etcd call failed: {e}", cfg.node_id));
                client = None;
                if pause(&cfg, &mut cmds).await == Some(Cmd::Stop) {
                    return;
                }
            }
        }
    }
}

/// Waits `retry_every`, or less if a command arrives (returned).
async fn pause(cfg: &ElectionConfig, cmds: &mut mpsc::UnboundedReceiver<Cmd>) -> Option<Cmd> {
    tokio::select! {
        c = cmds.recv() => Some(c.unwrap_or(Cmd::Stop)),
        _ = sleep(cfg.retry_every) => None,
    }
}

async fn connect(cfg: &ElectionConfig) -> Result<Client, Error> {
    // HTTP/2 pings, idle or not: a connection that stops carrying bytes without closing (a
    // firewall dropping the flow) fails within a ping's timeout instead of never.
    let opts = ConnectOptions::new()
        .with_connect_timeout(cfg.call_timeout)
        .with_timeout(cfg.call_timeout)
        .with_keep_alive(cfg.renew_every, cfg.call_timeout)
        .with_keep_alive_while_idle(true);
    timeout(
        cfg.call_timeout,
        Client::connect(&cfg.endpoints, Some(opts)),
    )
    .await
    .map_err(|_| Error::Etcd("connect timed out".into()))?
    .map_err(|e| Error::Etcd(e.to_string()))
}

/// Runs `f` within `call_timeout`.
async fn call<T>(
    cfg: &ElectionConfig,
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Error> {
    match timeout(cfg.call_timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Etcd(format!("{what}: {e}"))),
        Err(_) => Err(Error::Etcd(format!("{what}: timed out"))),
    }
}

fn parse_leader(cfg: &ElectionConfig, value: &[u8]) -> Result<LeaderRecord, Error> {
    serde_json::from_slice(value).map_err(|e| Error::Corrupt {
        key: cfg.leader_key(),
        reason: e.to_string(),
    })
}

/// Follow phase: returns `Vacant` once there is no leader key and the lease of the last
/// leader seen (`last_lease`) is gone, `Stop` on request. A leader key deleted while its
/// lease lives (by hand) does not make the post vacant: that leader's fence may still be
/// open until the lease expires. The watch is bounded by the lease TTL: the key is read
/// again then, so a connection that went silent is found by that call's time limit.
async fn follow(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    last_lease: &mut Option<i64>,
) -> Result<Next, Error> {
    let key = cfg.leader_key();
    loop {
        let resp = call(cfg, "get leader", c.get(key.as_str(), None)).await?;
        let Some(kv) = resp.kvs().first() else {
            shared.set_leader(None);
            if let Some(lease) = *last_lease {
                // etcd answers -1 for a lease that expired or was revoked, and whole seconds
                // left (rounded down: 0 in the last second) for a live one.
                let alive = call(cfg, "lease ttl", c.lease_time_to_live(lease, None)).await?;
                if alive.ttl() >= 0 {
                    shared.set_role(Role::Follower);
                    if pause(cfg, cmds).await == Some(Cmd::Stop) {
                        return Ok(Next::Stop);
                    }
                    continue;
                }
                *last_lease = None;
            }
            return Ok(Next::Vacant);
        };
        *last_lease = Some(kv.lease());
        let leader = parse_leader(cfg, kv.value())?;
        if shared.fence_leader_changed(leader) {
            tracing::info!(
                node = cfg.node_id,
                leader = leader.node_id,
                term = leader.term,
                "leader"
            );
        }
        shared.set_role(Role::Follower);
        let revision = resp.header().map_or(0, |h| h.revision());
        let opts = WatchOptions::new().with_start_revision(revision + 1);
        let mut watch = call(cfg, "watch leader", c.watch(key.as_str(), Some(opts))).await?;
        let reread = sleep(cfg.lease_ttl);
        tokio::pin!(reread);
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Resign) => {}
                    _ => return Ok(Next::Stop),
                },
                _ = &mut reread => break,
                msg = watch.message() => {
                    let msg = msg.map_err(|e| Error::Etcd(format!("watch leader: {e}")))?;
                    let Some(msg) = msg else { break };
                    if msg.canceled() {
                        break;
                    }
                    if msg.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        break;
                    }
                }
            }
        }
    }
}

/// Campaign phase: one transaction that creates the leader key on a new lease if it is absent
/// and raises the term counter it read, unchanged since.
async fn campaign(cfg: &ElectionConfig, shared: &Shared, c: &mut Client) -> Result<Next, Error> {
    shared.set_role(Role::Candidate);
    shared.count(Count::Campaign);
    let ttl_s = cfg.lease_ttl.as_secs() as i64;
    let t_send = shared.now_ns();
    let lease = call(cfg, "grant lease", c.lease_grant(ttl_s, None)).await?;
    // etcd may raise a TTL to its minimum, never lower it: the fence keeps the one asked for.
    let ttl = Duration::from_secs(lease.ttl().min(ttl_s).max(0) as u64);
    let term_key = cfg.term_key();
    let current = call(cfg, "get term", c.get(term_key.as_str(), None)).await?;
    let (term, term_rev) = match current.kvs().first() {
        None => (0, 0),
        Some(kv) => {
            let t = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| Error::Corrupt {
                    key: term_key.clone(),
                    reason: "not a decimal u32".into(),
                })?;
            (t, kv.mod_revision())
        }
    };
    let next = term.checked_add(1).ok_or_else(|| Error::Corrupt {
        key: term_key.clone(),
        reason: "the term counter is exhausted".into(),
    })?;
    let record = LeaderRecord {
        node_id: cfg.node_id,
        term: next,
    };
    let value = serde_json::to_vec(&record).expect("a LeaderRecord serializes");
    let leader_key = cfg.leader_key();
    let txn = Txn::new()
        .when([
            Compare::create_revision(leader_key.as_str(), CompareOp::Equal, 0),
            Compare::mod_revision(term_key.as_str(), CompareOp::Equal, term_rev),
        ])
        .and_then([
            TxnOp::put(
                leader_key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease.id())),
            ),
            TxnOp::put(term_key.as_str(), next.to_string(), None),
        ]);
    let done = call(cfg, "campaign", c.txn(txn)).await?;
    if !done.succeeded() {
        let _ = call(cfg, "revoke lease", c.lease_revoke(lease.id())).await;
        return Ok(Next::Vacant);
    }
    let valid_for = ttl.saturating_sub(cfg.fence_margin);
    shared.win(next, t_send, valid_for);
    tracing::info!(
        node = cfg.node_id,
        term = next,
        lease_ttl_s = ttl.as_secs(),
        "won the election: leading"
    );
    Ok(Next::Won(Won {
        lease: lease.id(),
        term: next,
        ttl,
    }))
}

/// Lead phase: keeps the lease alive until the fence lapses, etcd says the lease is gone, or
/// the owner resigns or stops. Returns the command that ended it, if one did.
async fn lead(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    Won { lease, term, ttl }: Won,
    warn: &mut LimitedWarn,
) -> Option<Cmd> {
    let valid_for = ttl.saturating_sub(cfg.fence_margin);
    let mut stream = None;
    let mut next_renew = tokio::time::Instant::now() + cfg.renew_every;
    let ended = loop {
        let until_ns = shared.deadline_ns();
        let now_ns = shared.now_ns();
        if until_ns <= now_ns {
            break None;
        }
        let lapse_at = tokio::time::Instant::now() + Duration::from_nanos(until_ns - now_ns);
        tokio::select! {
            cmd = cmds.recv() => break Some(cmd.unwrap_or(Cmd::Stop)),
            _ = tokio::time::sleep_until(lapse_at) => break None,
            _ = tokio::time::sleep_until(next_renew) => {
                let t_send = shared.now_ns();
                match renew(cfg, c, &mut stream, lease).await {
                    Ok(Renewal::Granted(granted)) => {
                        shared.count(Count::KeepAlive);
                        let valid = valid_for.min(granted.saturating_sub(cfg.fence_margin));
                        shared.extend(t_send, valid);
                        next_renew = tokio::time::Instant::now() + cfg.renew_every;
                    }
                    Ok(Renewal::KeyNotOurs) => {
                        tracing::warn!(node = cfg.node_id, term, "the leader key is no longer bound to this leader's lease (deleted by hand?): stopping");
                        break None;
                    }
                    Ok(Renewal::LeaseGone) => {
                        tracing::warn!(node = cfg.node_id, term, "etcd says the lease is gone");
                        break None;
                    }
                    Err(e) => {
                        shared.count(Count::KeepAliveFailure);
                        let node = cfg.node_id;
                        warn.warn(format_args!("node {node} term {term}: renewal failed: {e}"));
                        next_renew = tokio::time::Instant::now() + cfg.retry_every;
                    }
                }
            }
        }
    };
    let resigned = ended.is_some();
    shared.end_leadership(resigned);
    if resigned {
        tracing::info!(node = cfg.node_id, term, "resigned");
    } else {
        tracing::warn!(node = cfg.node_id, term, "lease lapsed: stopped leading");
    }
    // Best effort: a revoked lease frees the key at once instead of after its TTL.
    let _ = call(cfg, "revoke lease", c.lease_revoke(lease)).await;
    ended
}

/// What one renewal found.
enum Renewal {
    /// etcd kept the lease alive for this TTL, and the leader key is still bound to it.
    Granted(Duration),
    /// etcd answered that the lease no longer exists.
    LeaseGone,
    /// The lease lives but the leader key is gone or bound to another lease.
    KeyNotOurs,
}

/// One renewal: a keep-alive on `stream` (opened if `None`), then whether the leader key is
/// still bound to `lease`, checked before the fence moves, so a leader whose key was deleted
/// by hand (its lease alive) stops instead of leading beside a new leader.
///
/// Errors: a call failed (the fence is then not moved).
async fn renew(
    cfg: &ElectionConfig,
    c: &mut Client,
    stream: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    lease: i64,
) -> Result<Renewal, Error> {
    let Some(granted) = keep_alive(cfg, c, stream, lease).await? else {
        return Ok(Renewal::LeaseGone);
    };
    let r = call(cfg, "get leader", c.get(cfg.leader_key(), None)).await?;
    Ok(match r.kvs().first() {
        Some(kv) if kv.lease() == lease => Renewal::Granted(granted),
        _ => Renewal::KeyNotOurs,
    })
}

/// One keep-alive on `stream` (opened if `None`): `Some(ttl)` granted, `None` when etcd
/// answers that the lease no longer exists. A failed keep-alive drops the stream (a late
/// answer on it would be taken for the next request's).
async fn keep_alive(
    cfg: &ElectionConfig,
    c: &mut Client,
    stream: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    lease: i64,
) -> Result<Option<Duration>, Error> {
    if stream.is_none() {
        *stream = Some(call(cfg, "open keep-alive", c.lease_keep_alive(lease)).await?);
    }
    let (keeper, responses) = stream.as_mut().expect("opened above");
    let answer = timeout(cfg.call_timeout, async {
        keeper.keep_alive().await?;
        responses.message().await
    })
    .await;
    let failed = match answer {
        Ok(Ok(Some(r))) if r.ttl() > 0 => return Ok(Some(Duration::from_secs(r.ttl() as u64))),
        Ok(Ok(Some(_))) => return Ok(None),
        Ok(Ok(None)) => Error::Etcd("keep-alive stream closed".into()),
        Ok(Err(e)) => Error::Etcd(format!("keep-alive: {e}")),
        Err(_) => Error::Etcd("keep-alive timed out".into()),
    };
    *stream = None;
    Err(failed)
}
