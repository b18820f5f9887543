//! The `election` thread: one member's conversation with etcd, as a loop of three phases —
//! **follow** (read the group's keys; watch them, keeping the in-sync set current, until the
//! leader key is deleted), **campaign**
//! (when there is no leader key, this member is eligible and the in-sync set names it or does
//! not exist: one transaction that creates the leader key on a fresh lease, raises the term
//! and records the in-sync set of the new term), **lead** (keep the lease alive; move the
//! fence forward only on etcd's acknowledgement of a keep-alive, from the instant that
//! keep-alive was sent; record the in-sync sets the owner publishes).
//!
//! The thread runs a single-threaded tokio runtime because `etcd-client` is async; nothing
//! else in seqstream is. Every etcd call has a time limit (`call_timeout`); a failed call is
//! counted, logged and retried after `retry_every`, and never touches the fence except to
//! close it.
//!
//! A keep-alive stream whose call timed out is dropped, never reused: a late answer on it
//! would be taken for the answer to a later keep-alive and move the fence past the lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use seqstream_agent::daemon::LimitedWarn;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};

use crate::config::ElectionConfig;
use crate::fence::{Count, Fence, Role, Shared};
use crate::{Error, InSyncRecord, LeaderRecord, NodeSet, SwitchoverRecord};

/// What the owner asks of the `election` thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    /// Give up a leadership now (the fence closes first), and campaign no more until
    /// [`Election::set_eligible`] says so.
    Resign,
    /// Resign if leading, then end the thread.
    Stop,
    /// Record `set` as the in-sync set, if still leading; confirm `generation` once etcd
    /// holds it (retried at each renewal until then, or until a later publication).
    InSync { generation: u64, set: NodeSet },
    /// Revoke the lease of `leader`, if its key is still the current one.
    Depose { leader: LeaderRecord },
}

/// One member's election: the `election` thread and the handle to its state. Dropping it
/// stops the thread; a leader resigns first (its lease is revoked, so the others need not
/// wait for it to expire).
#[derive(Debug)]
pub struct Election {
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedSender<Cmd>,
    thread: Option<JoinHandle<()>>,
    generations: AtomicU64,
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
                rt.block_on(run(cfg, state, Commands { rx, depose: None }));
            })
            .map_err(Error::Spawn)?;
        Ok(Election {
            shared,
            cmds,
            thread: Some(thread),
            generations: AtomicU64::new(0),
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

    /// Asks the `election` thread to record `set` (this leader included) as the group's
    /// in-sync set in etcd: the members that hold every frame released so far, and so may
    /// take over. Returns the publication's generation; [`Fence::in_sync_published`] says
    /// when etcd holds it. It takes effect only while this member leads the term it won (the
    /// transaction compares the leader key's creation revision); a later publication
    /// supersedes one not yet confirmed.
    ///
    /// The caller's order is what makes the record safe: add a member to the set only once it
    /// holds every released frame, and release anything a member lacks only once etcd
    /// confirmed a set without it.
    pub fn publish_in_sync(&self, set: NodeSet) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.cmds.send(Cmd::InSync { generation, set });
        generation
    }

    /// Revokes the lease of `leader` if it still leads (its leader key names it): the key goes
    /// at once instead of a TTL after the leader's death, and the members campaign. Only for a
    /// leader known to be dead — its owner's evidence is that the leader's host refuses
    /// connections to its replication address — and only from a member that may take over.
    ///
    /// Why it is safe even if that leader were alive: under `standby-ack` it can release
    /// nothing more without the acks of the standby that deposed it (which leads now, and
    /// acks no one), and it cannot let that standby go, since recording an in-sync set
    /// compares its leader key, now gone. What it sequences meanwhile is released to no one,
    /// confirmed to no client, and cut when it rejoins.
    pub fn depose(&self, leader: LeaderRecord) {
        let _ = self.cmds.send(Cmd::Depose { leader });
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
    /// No leader key, but this member may not campaign (not eligible, or the in-sync set
    /// does not name it): wait for the group's keys to change after `revision` (the read it
    /// decided on), then read again.
    Barred { revision: i64 },
    /// This member won: lead.
    Won(Won),
    /// Stop the thread.
    Stop,
}

/// A won leadership: its lease, its term, the TTL the fence counts with, and the etcd
/// revision that created its leader key (what its in-sync writes compare).
struct Won {
    lease: i64,
    term: u32,
    ttl: Duration,
    revision: i64,
}

/// After a failed revocation of a dead leader's lease, the next try: 50 ms. A lease that
/// runs its full TTL instead (1 s or more) stalls the group that long.
const DEPOSE_RETRY: Duration = Duration::from_millis(50);

/// The owner's commands as the thread receives them. A [`Cmd::Depose`] is also kept until the
/// dead leader's lease is gone or a later leader is seen, whatever phase it arrived in: one
/// that came during a pause, or whose revocation failed, is carried out by the follow phase
/// (and retried every [`DEPOSE_RETRY`]) instead of being lost, which left the dead leader's
/// lease to run its full TTL.
struct Commands {
    rx: mpsc::UnboundedReceiver<Cmd>,
    /// The leadership to depose, asked and not done yet.
    depose: Option<LeaderRecord>,
}

impl Commands {
    /// The next command; `Stop` once the owner is gone.
    async fn recv(&mut self) -> Cmd {
        let cmd = self.rx.recv().await.unwrap_or(Cmd::Stop);
        if let Cmd::Depose { leader } = cmd {
            self.depose = Some(leader);
        }
        cmd
    }
}

/// The thread's body: connect, then follow, campaign and lead until stopped. Failures repeat
/// every `retry_every` while etcd is away: their log lines are rate-limited (the counters
/// keep the exact numbers).
async fn run(cfg: ElectionConfig, shared: Arc<Shared>, mut cmds: Commands) {
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
        let (mut read, mut granted) = (None, None);
        let next = match follow(
            &cfg,
            &shared,
            c,
            &mut cmds,
            &mut last_lease,
            &mut read,
            &mut granted,
        )
        .await
        {
            Ok(Next::Vacant) if shared.eligible.load(Ordering::Relaxed) => {
                campaign(&cfg, &shared, c, read, &mut granted).await
            }
            Ok(Next::Vacant) => Ok(Next::Barred {
                revision: read.as_ref().map_or(0, |v| v.revision),
            }),
            other => other,
        };
        revoke_unused(&cfg, c, &mut granted).await;
        // No leader and this member may not lead (not eligible, or not in the in-sync set):
        // wait for a change (the next leader's key, most likely), then read again.
        let next = match next {
            Ok(Next::Barred { revision }) => {
                shared.set_role(Role::Unknown);
                match wait_for_change(&cfg, c, &mut cmds, revision).await {
                    Ok(Some(Cmd::Stop)) => Ok(Next::Stop),
                    Ok(_) => Ok(Next::Vacant),
                    Err(e) => Err(e),
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
            Ok(Next::Vacant | Next::Barred { .. }) => {}
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

/// The etcd revision a read answered at.
fn revision_of(resp: &etcd_client::GetResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// Waits until a key of the group changes after `revision` (0: unknown, no watch), for
/// `retry_every` at most, or less if a command arrives (returned): a barred member learns of
/// the next leader as its key is written, not a pause later.
async fn wait_for_change(
    cfg: &ElectionConfig,
    c: &mut Client,
    cmds: &mut Commands,
    revision: i64,
) -> Result<Option<Cmd>, Error> {
    if revision == 0 {
        return Ok(pause(cfg, cmds).await);
    }
    let opts = WatchOptions::new()
        .with_start_revision(revision + 1)
        .with_prefix();
    let group = format!("{}/", cfg.prefix);
    let mut watch = call(cfg, "watch the group", c.watch(group, Some(opts))).await?;
    tokio::select! {
        cmd = cmds.recv() => Ok(Some(cmd)),
        _ = sleep(cfg.retry_every) => Ok(None),
        _ = watch.message() => Ok(None),
    }
}

/// Waits `retry_every`, or less if a command arrives (returned).
async fn pause(cfg: &ElectionConfig, cmds: &mut Commands) -> Option<Cmd> {
    tokio::select! {
        c = cmds.recv() => Some(c),
        _ = sleep(cfg.retry_every) => None,
    }
}

pub(crate) async fn connect(cfg: &ElectionConfig) -> Result<Client, Error> {
    // HTTP/2 pings while a stream is open: a watch on a connection that stops carrying bytes
    // without closing (a firewall dropping the flow) fails within a ping's timeout instead of
    // never. Not while idle: etcd counts pings without a stream as abuse at any rate.
    let opts = ConnectOptions::new()
        .with_connect_timeout(cfg.call_timeout)
        .with_timeout(cfg.call_timeout)
        .with_keep_alive(cfg.ping_every, cfg.call_timeout)
        .with_keep_alive_while_idle(false);
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

/// Every key of the group (`<prefix>/…`) in one read, within `call_timeout`.
pub(crate) async fn get_group(
    cfg: &ElectionConfig,
    c: &mut Client,
) -> Result<etcd_client::GetResponse, Error> {
    let group = format!("{}/", cfg.prefix);
    call(
        cfg,
        "get group keys",
        c.get(group, Some(GetOptions::new().with_prefix())),
    )
    .await
}

pub(crate) fn parse_leader(cfg: &ElectionConfig, value: &[u8]) -> Result<LeaderRecord, Error> {
    serde_json::from_slice(value).map_err(|e| Error::Corrupt {
        key: cfg.leader_key(),
        reason: e.to_string(),
    })
}

pub(crate) fn parse_in_sync(cfg: &ElectionConfig, value: &[u8]) -> Result<NodeSet, Error> {
    let corrupt = |reason: String| Error::Corrupt {
        key: cfg.in_sync_key(),
        reason,
    };
    let r: InSyncRecord = serde_json::from_slice(value).map_err(|e| corrupt(e.to_string()))?;
    if let Some(n) = r
        .nodes
        .iter()
        .find(|n| !(1..=crate::MAX_NODE_ID).contains(n))
    {
        return Err(corrupt(format!("node id {n} is outside 1..=64")));
    }
    Ok(NodeSet::of(r.nodes))
}

fn parse_switchover(cfg: &ElectionConfig, value: &[u8]) -> Result<SwitchoverRecord, Error> {
    serde_json::from_slice(value).map_err(|e| Error::Corrupt {
        key: cfg.switchover_key(),
        reason: e.to_string(),
    })
}

fn parse_term(cfg: &ElectionConfig, value: &[u8]) -> Result<u32, Error> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(|| Error::Corrupt {
            key: cfg.term_key(),
            reason: "not a decimal u32".into(),
        })
}

/// The group's keys as a campaign decides on them: read in one get ([`read`](Self::read)),
/// then kept current by the follow phase's watch ([`apply`](Self::apply)), so a member that
/// deposed the leader itself campaigns on the watch's news without reading again. Its
/// transaction compares every revision it relies on: a view that missed a change makes it
/// fail, never succeed wrongly.
#[derive(Debug, Clone)]
struct GroupView {
    /// The etcd revision the view is as of.
    revision: i64,
    /// Whether a leader key exists.
    leader: bool,
    /// The in-sync set and its key's mod revision.
    in_sync: Option<(NodeSet, i64)>,
    /// The term counter and its key's mod revision (`(0, 0)`: no key).
    term: (u32, i64),
    /// A switchover request.
    switchover: Option<SwitchoverRecord>,
}

impl GroupView {
    /// The view of a read of every key of the group ([`get_group`]).
    ///
    /// Errors: `Corrupt` for a key whose value does not parse.
    fn read(cfg: &ElectionConfig, resp: &etcd_client::GetResponse) -> Result<Self, Error> {
        let mut view = GroupView {
            revision: revision_of(resp),
            leader: false,
            in_sync: None,
            term: (0, 0),
            switchover: None,
        };
        for kv in resp.kvs() {
            view.set(cfg, kv, false)?;
        }
        Ok(view)
    }

    /// Whether a switchover asked of the last term's leader names another member than
    /// `node_id` to campaign.
    fn switchover_to_another(&self, node_id: u32) -> bool {
        self.switchover
            .is_some_and(|r| r.term == self.term.0 && r.to != node_id)
    }

    /// Whether the in-sync set exists and does not name `node_id`.
    fn in_sync_without(&self, node_id: u32) -> bool {
        self.in_sync.is_some_and(|(set, _)| !set.contains(node_id))
    }

    /// Applies one event of a watch of the group.
    ///
    /// Errors: `Corrupt` for a key whose new value does not parse.
    fn apply(&mut self, cfg: &ElectionConfig, e: &etcd_client::Event) -> Result<(), Error> {
        match e.kv() {
            Some(kv) => {
                self.revision = self.revision.max(kv.mod_revision());
                self.set(cfg, kv, e.event_type() == EventType::Delete)
            }
            None => Ok(()),
        }
    }

    fn set(
        &mut self,
        cfg: &ElectionConfig,
        kv: &etcd_client::KeyValue,
        deleted: bool,
    ) -> Result<(), Error> {
        let key = kv.key();
        let value = (!deleted).then(|| kv.value());
        if key == cfg.leader_key().as_bytes() {
            self.leader = !deleted;
        } else if key == cfg.in_sync_key().as_bytes() {
            self.in_sync = value
                .map(|v| Ok::<_, Error>((parse_in_sync(cfg, v)?, kv.mod_revision())))
                .transpose()?;
        } else if key == cfg.term_key().as_bytes() {
            self.term = match value {
                Some(v) => (parse_term(cfg, v)?, kv.mod_revision()),
                None => (0, 0),
            };
        } else if key == cfg.switchover_key().as_bytes() {
            self.switchover = value.map(|v| parse_switchover(cfg, v)).transpose()?;
        }
        Ok(())
    }
}

pub(crate) fn in_sync_value(term: u32, set: NodeSet) -> Vec<u8> {
    let r = InSyncRecord {
        term,
        nodes: set.nodes(),
    };
    serde_json::to_vec(&r).expect("an InSyncRecord serializes")
}

/// A lease granted for a campaign before it began: a member that deposes a dead leader asks
/// for it together with the revocation, so its campaign is one round trip shorter. One that
/// no campaign used is revoked once another leader is seen or the round ends (or, should that
/// fail, expires: no key is bound to it).
#[derive(Debug, Clone, Copy)]
struct Granted {
    /// The lease id.
    id: i64,
    /// The TTL etcd granted, s.
    ttl_s: i64,
    /// When the grant was sent (the fence counts the lease from then), [`Shared::now_ns`].
    t_send: u64,
}

/// Grants a lease of the configured TTL (`cfg.lease_ttl`).
async fn grant(cfg: &ElectionConfig, shared: &Shared, c: &mut Client) -> Result<Granted, Error> {
    let t_send = shared.now_ns();
    let ttl_s = cfg.lease_ttl.as_secs() as i64;
    let lease = call(cfg, "grant lease", c.lease_grant(ttl_s, None)).await?;
    Ok(Granted {
        id: lease.id(),
        ttl_s: lease.ttl(),
        t_send,
    })
}

/// Revokes the lease in `granted`, if any, that no campaign used (best effort: otherwise it
/// expires, no key being bound to it).
async fn revoke_unused(cfg: &ElectionConfig, c: &mut Client, granted: &mut Option<Granted>) {
    if let Some(g) = granted.take() {
        let _ = call(cfg, "revoke an unused lease", c.lease_revoke(g.id)).await;
    }
}

/// Follow phase: returns `Vacant` once there is no leader key and the lease of the last
/// leader seen (`last_lease`) is gone, with the group's keys in `read` as read then, or as
/// the watch showed them when this member revoked that lease itself (the campaign starts
/// from them: its transaction compares every revision it relies on, so a view one round trip
/// old is as safe as a new read), `Stop` on request. A leader key deleted while its
/// lease lives (by hand) does not make the post vacant: that leader's fence may still be
/// open until the lease expires. The watch is bounded by the lease TTL: the key is read
/// again then, so a connection that went silent is found by that call's time limit.
async fn follow(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    cmds: &mut Commands,
    last_lease: &mut Option<i64>,
    read: &mut Option<GroupView>,
    granted: &mut Option<Granted>,
) -> Result<Next, Error> {
    let key = cfg.leader_key();
    loop {
        let resp = get_group(cfg, c).await?;
        let mut view = GroupView::read(cfg, &resp)?;
        shared.set_in_sync(view.in_sync.map(|(set, _)| set));
        let Some(kv) = resp.kvs().iter().find(|kv| kv.key() == key.as_bytes()) else {
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
            *read = Some(view);
            return Ok(Next::Vacant);
        };
        let lease = kv.lease();
        *last_lease = Some(lease);
        // Another member won: the lease granted for this member's campaign is not needed.
        revoke_unused(cfg, c, granted).await;
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
        let revision = view.revision;
        // The whole group: the leader key's deletion ends the phase, and the in-sync set is
        // kept current (a standby that has just joined it may depose a dead leader at once,
        // not only after its next read).
        let opts = WatchOptions::new()
            .with_start_revision(revision + 1)
            .with_prefix();
        let group = format!("{}/", cfg.prefix);
        let mut watch = call(cfg, "watch the group", c.watch(group, Some(opts))).await?;
        let reread = sleep(cfg.lease_ttl);
        tokio::pin!(reread);
        // A deposition of an earlier leader is moot; one of this leader asked before this
        // read (during a pause, or one whose revocation failed) is tried at once.
        if cmds.depose.is_some_and(|d| d.term < leader.term) {
            cmds.depose = None;
        }
        let mut deposing = cmds.depose == Some(leader);
        let mut failed_revokes = 0u32;
        let retry = sleep(Duration::ZERO);
        tokio::pin!(retry);
        loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Cmd::Depose { leader: dead } if dead == leader => {
                        deposing = true;
                        retry.as_mut().reset(tokio::time::Instant::now());
                    }
                    Cmd::Resign | Cmd::InSync { .. } | Cmd::Depose { .. } => {}
                    Cmd::Stop => return Ok(Next::Stop),
                },
                _ = &mut retry, if deposing => {
                    match depose(cfg, shared, c, leader, lease, &view, granted).await {
                        Ok(()) => {
                            // Gone: the vacancy its key's deletion makes needs no check of it.
                            *last_lease = None;
                            cmds.depose = None;
                            deposing = false;
                            failed_revokes = 0;
                        }
                        Err(e) => {
                            // The first failure says so; the counters count them all.
                            if failed_revokes == 0 {
                                tracing::warn!(node = cfg.node_id, retry_every_ms = DEPOSE_RETRY.as_millis() as u64, "revoking the dead leader's lease failed: {e}");
                            }
                            failed_revokes += 1;
                            retry.as_mut().reset(tokio::time::Instant::now() + DEPOSE_RETRY);
                        }
                    }
                }
                _ = &mut reread => break,
                msg = watch.message() => {
                    let msg = msg.map_err(|e| Error::Etcd(format!("watch the group: {e}")))?;
                    let Some(msg) = msg else { break };
                    if msg.canceled() {
                        break;
                    }
                    let mut leader_gone = false;
                    for e in msg.events() {
                        view.apply(cfg, e)?;
                        leader_gone |= e.event_type() == EventType::Delete
                            && e.kv().is_some_and(|kv| kv.key() == key.as_bytes());
                    }
                    shared.set_in_sync(view.in_sync.map(|(set, _)| set));
                    // A lease this member revoked itself needs no check: the watch's view is
                    // as good as a new read (the campaign's transaction checks it).
                    if leader_gone && !view.leader && last_lease.is_none() {
                        shared.set_leader(None);
                        *read = Some(view);
                        return Ok(Next::Vacant);
                    }
                    if leader_gone {
                        break;
                    }
                }
            }
        }
    }
}

/// Revokes `lease`, the lease of `dead` ([`revoke_dead`]); a member that will campaign next
/// (eligible, named by the in-sync set or with none recorded, and not barred by a switchover
/// to another member, as `view` shows the group) asks for its campaign's lease at the same
/// time, into `granted` (a failed grant is made again by the campaign).
async fn depose(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    dead: LeaderRecord,
    lease: i64,
    view: &GroupView,
    granted: &mut Option<Granted>,
) -> Result<(), String> {
    let campaigns = shared.eligible.load(Ordering::Relaxed)
        && !view.in_sync_without(cfg.node_id)
        && !view.switchover_to_another(cfg.node_id);
    if !campaigns || granted.is_some() {
        return revoke_dead(cfg, shared, c, dead, lease).await;
    }
    let mut second = c.clone();
    let (revoked, lease) = tokio::join!(
        revoke_dead(cfg, shared, c, dead, lease),
        grant(cfg, shared, &mut second)
    );
    *granted = lease.ok();
    revoked
}

/// Revokes `lease`, the lease of a leader known to be dead (see [`Election::depose`]).
/// `Ok` once it is gone: revoked here (counted), or already (expired, or revoked by another
/// member). `Err` says why etcd did not revoke it (counted; the caller tries again after
/// [`DEPOSE_RETRY`]).
async fn revoke_dead(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    dead: LeaderRecord,
    lease: i64,
) -> Result<(), String> {
    let e = match timeout(cfg.call_timeout, c.lease_revoke(lease)).await {
        Ok(Ok(_)) => {
            tracing::info!(
                node = cfg.node_id,
                leader = dead.node_id,
                term = dead.term,
                "revoked the dead leader's lease"
            );
            shared.count(Count::Deposition);
            return Ok(());
        }
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.message().contains("lease not found") => {
            return Ok(());
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_string(),
    };
    shared.count(Count::EtcdError);
    Err(e)
}

/// Campaign phase: unless the in-sync set exists and does not name this member, one
/// transaction that creates the leader key on a new lease if it is absent, raises the term
/// counter it read and records the in-sync set it read (plus this member) for the new term,
/// both unchanged since.
///
/// `read`: the group's keys as the follow phase last read them, if it did.
async fn campaign(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    read: Option<GroupView>,
    granted: &mut Option<Granted>,
) -> Result<Next, Error> {
    let (leader_key, term_key, in_sync_key, switchover_key) = (
        cfg.leader_key(),
        cfg.term_key(),
        cfg.in_sync_key(),
        cfg.switchover_key(),
    );
    let view = match read {
        Some(view) => view,
        None => GroupView::read(cfg, &get_group(cfg, c).await?)?,
    };
    if view.leader {
        return Ok(Next::Vacant); // a leader won meanwhile: follow it
    }
    let (in_sync, in_sync_rev) = view
        .in_sync
        .map_or((None, 0), |(set, rev)| (Some(set), rev));
    let (term, term_rev) = view.term;
    shared.set_in_sync(in_sync);
    // A switchover asked of the last term's leader names who campaigns: the others wait.
    if view.switchover_to_another(cfg.node_id) {
        shared.count_barred();
        return Ok(Next::Barred {
            revision: view.revision,
        });
    }
    let mut recorded = in_sync.unwrap_or_default();
    if view.in_sync_without(cfg.node_id) {
        if shared.count_barred() == 0 {
            tracing::warn!(
                node = cfg.node_id,
                in_sync = %recorded,
                "no leader, and the in-sync set does not name this member: it may lack released frames, so it does not campaign"
            );
        }
        return Ok(Next::Barred {
            revision: view.revision,
        });
    }
    recorded.insert(cfg.node_id);
    shared.set_role(Role::Candidate);
    shared.count(Count::Campaign);
    let lease = match granted.take() {
        Some(g) => g,
        None => grant(cfg, shared, c).await?,
    };
    // etcd may raise a TTL to its minimum, never lower it: the fence keeps the one asked for.
    let ttl_s = cfg.lease_ttl.as_secs() as i64;
    let ttl = Duration::from_secs(lease.ttl_s.min(ttl_s).max(0) as u64);
    let next = term.checked_add(1).ok_or_else(|| Error::Corrupt {
        key: term_key.clone(),
        reason: "the term counter is exhausted".into(),
    })?;
    let record = LeaderRecord {
        node_id: cfg.node_id,
        term: next,
    };
    let value = serde_json::to_vec(&record).expect("a LeaderRecord serializes");
    let txn = Txn::new()
        .when([
            Compare::create_revision(leader_key.as_str(), CompareOp::Equal, 0),
            Compare::mod_revision(term_key.as_str(), CompareOp::Equal, term_rev),
            Compare::mod_revision(in_sync_key.as_str(), CompareOp::Equal, in_sync_rev),
        ])
        .and_then([
            TxnOp::put(
                leader_key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease.id)),
            ),
            TxnOp::put(term_key.as_str(), next.to_string(), None),
            TxnOp::put(in_sync_key.as_str(), in_sync_value(next, recorded), None),
            TxnOp::delete(switchover_key.as_str(), None),
        ]);
    let done = call(cfg, "campaign", c.txn(txn)).await?;
    if !done.succeeded() {
        let _ = call(cfg, "revoke lease", c.lease_revoke(lease.id)).await;
        return Ok(Next::Vacant);
    }
    let revision = done.header().map_or(0, |h| h.revision());
    let valid_for = ttl.saturating_sub(cfg.fence_margin);
    shared.set_in_sync_at_win(recorded);
    shared.win(next, lease.t_send, valid_for);
    tracing::info!(
        node = cfg.node_id,
        term = next,
        lease_ttl_s = ttl.as_secs(),
        in_sync = %recorded,
        "won the election: leading"
    );
    Ok(Next::Won(Won {
        lease: lease.id,
        term: next,
        ttl,
        revision,
    }))
}

/// Lead phase: keeps the lease alive until the fence lapses, etcd says the lease is gone, or
/// the owner resigns or stops; records the in-sync sets the owner publishes. Returns the
/// command that ended it, if one did.
async fn lead(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    cmds: &mut Commands,
    won: Won,
    warn: &mut LimitedWarn,
) -> Option<Cmd> {
    let Won {
        lease, term, ttl, ..
    } = won;
    let valid_for = ttl.saturating_sub(cfg.fence_margin);
    let mut stream = None;
    let mut next_renew = tokio::time::Instant::now() + cfg.renew_every;
    // The latest publication etcd has not confirmed yet, and the mod revision of the in-sync
    // key as this leader last wrote it (its campaign transaction wrote it first).
    let mut pending: Option<(u64, NodeSet)> = None;
    let mut in_sync_rev = won.revision;
    // Switchover requests for this term; a failed watch is opened again after a renewal.
    let mut requests = watch_requests(cfg, shared, c, &won, warn).await;
    let ended = loop {
        if let Some((generation, set)) = pending {
            match record_in_sync(cfg, c, &won, set, &mut in_sync_rev).await {
                Ok(true) => {
                    shared.confirm_in_sync(generation, set);
                    tracing::info!(node = cfg.node_id, term, in_sync = %set, "recorded the in-sync set");
                    pending = None;
                }
                Ok(false) => {
                    tracing::warn!(
                        node = cfg.node_id,
                        term,
                        "the leader key is no longer the one this leader created: stopping"
                    );
                    break None;
                }
                Err(e) => {
                    shared.count(Count::EtcdError);
                    warn.warn(format_args!(
                        "node {} term {term}: recording the in-sync set failed: {e}",
                        cfg.node_id
                    ));
                }
            }
        }
        let until_ns = shared.deadline_ns();
        let now_ns = shared.now_ns();
        if until_ns <= now_ns {
            break None;
        }
        let lapse_at = tokio::time::Instant::now() + Duration::from_nanos(until_ns - now_ns);
        let request = async {
            match requests.as_mut() {
                Some(w) => w.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Cmd::InSync { generation, set } => pending = Some((generation, set)),
                // Asked while following the last leader; this member leads now.
                Cmd::Depose { .. } => {}
                other => break Some(other),
            },
            msg = request => match msg {
                Ok(Some(m)) if !m.canceled() => {
                    for e in m.events().iter().filter(|e| e.event_type() == EventType::Put) {
                        match e.kv().map(|kv| parse_switchover(cfg, kv.value())) {
                            Some(Ok(r)) if r.from == cfg.node_id && r.term == term => {
                                tracing::info!(node = cfg.node_id, term, to = r.to, "switchover asked");
                                shared.request_handover(r.to);
                            }
                            Some(Ok(r)) => tracing::warn!(node = cfg.node_id, term, asked_of = r.from, asked_term = r.term, "a switchover request for another leadership: ignored"),
                            Some(Err(e)) => tracing::warn!(node = cfg.node_id, term, "{e}"),
                            None => {}
                        }
                    }
                }
                _ => requests = None,
            },
            _ = tokio::time::sleep_until(lapse_at) => break None,
            _ = tokio::time::sleep_until(next_renew) => {
                let t_send = shared.now_ns();
                match renew(cfg, c, &mut stream, lease).await {
                    Ok(Renewal::Granted(granted)) => {
                        shared.count(Count::KeepAlive);
                        let valid = valid_for.min(granted.saturating_sub(cfg.fence_margin));
                        shared.extend(t_send, valid);
                        next_renew = tokio::time::Instant::now() + cfg.renew_every;
                        if requests.is_none() {
                            requests = watch_requests(cfg, shared, c, &won, warn).await;
                        }
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
                        // The connection may have died without a close (pings are seconds
                        // apart): the next renewal, and the watch, go over a new one, while
                        // the fence still holds.
                        if let Ok(fresh) = connect(cfg).await {
                            *c = fresh;
                            stream = None;
                            requests = None;
                        }
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

/// A watch of the switchover key from the revision `won` began at; `None` when it could not
/// be opened (counted and logged).
async fn watch_requests(
    cfg: &ElectionConfig,
    shared: &Shared,
    c: &mut Client,
    won: &Won,
    warn: &mut LimitedWarn,
) -> Option<etcd_client::WatchStream> {
    let opts = WatchOptions::new().with_start_revision(won.revision + 1);
    match call(
        cfg,
        "watch switchover",
        c.watch(cfg.switchover_key(), Some(opts)),
    )
    .await
    {
        Ok(w) => Some(w),
        Err(e) => {
            shared.count(Count::EtcdError);
            warn.warn(format_args!("node {} term {}: {e}", cfg.node_id, won.term));
            None
        }
    }
}

/// Writes `set` as the in-sync set of `won`'s term, in a transaction that holds only while
/// the leader key is the one `won` created and the in-sync key is as this leader last wrote
/// it (`in_sync_rev`, moved to this write's revision). `Ok(false)`: the leader key is not
/// `won`'s (this member no longer leads that term).
///
/// The second comparison orders this leader's own writes: a write whose call timed out may
/// still land later, and it then fails its comparison instead of overwriting a later set.
/// When that comparison alone fails (an earlier write landed late), the key's revision is
/// read again and the write repeated.
async fn record_in_sync(
    cfg: &ElectionConfig,
    c: &mut Client,
    won: &Won,
    set: NodeSet,
    in_sync_rev: &mut i64,
) -> Result<bool, Error> {
    let (leader_key, in_sync_key) = (cfg.leader_key(), cfg.in_sync_key());
    loop {
        let txn = Txn::new()
            .when([
                Compare::create_revision(leader_key.as_str(), CompareOp::Equal, won.revision),
                Compare::mod_revision(in_sync_key.as_str(), CompareOp::Equal, *in_sync_rev),
            ])
            .and_then([TxnOp::put(
                in_sync_key.as_str(),
                in_sync_value(won.term, set),
                None,
            )])
            .or_else([
                TxnOp::get(leader_key.as_str(), None),
                TxnOp::get(in_sync_key.as_str(), None),
            ]);
        let done = call(cfg, "record in-sync", c.txn(txn)).await?;
        if done.succeeded() {
            *in_sync_rev = done.header().map_or(0, |h| h.revision());
            return Ok(true);
        }
        let mut leader_rev = 0;
        let mut current_rev = 0;
        for r in done.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = r {
                for kv in g.kvs() {
                    if kv.key() == leader_key.as_bytes() {
                        leader_rev = kv.create_revision();
                    } else {
                        current_rev = kv.mod_revision();
                    }
                }
            }
        }
        if leader_rev != won.revision {
            return Ok(false);
        }
        *in_sync_rev = current_rev;
    }
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
