//! The sequencer group member role, `[[sequencer_group]]` ([`GroupArgs`]): this host's member
//! of a stream's sequencer group (`DESIGN.md`, "Sequencer failover"). Who leads is decided by
//! etcd ([`seqstream_election`]); this module owns what a member does about it, on one agent
//! ([`Member`]) and the group's replication server:
//!
//! ```text
//!            fence opens (this member won a term)
//!   Idle ──────────────────────────────────────────────▶ Leading: Sequencer::open on the
//!    │ another member leads                          ▲   store, fenced by the election; it
//!    ▼                                               │   starts its term in the store
//!   Standby: a replication Follower of the leader ───┘
//!    ▲       (from this member's address), eligible     │ another member leads
//!    └───────── once caught up ◀────────────────────────┘ (this one was deposed)
//! ```
//!
//! The **replication server** runs in every state on the member's replication address and
//! the same store, under the `standby-ack` release policy
//! ([`seqstream_replication::release`]): the other members are its standbys (each says so
//! in its hello, from its member address), every other replica a consumer that receives only
//! what every standby holds. So every member's store holds every
//! frame any consumer ever received, whichever member leads next. Under `immediate`,
//! consumers receive what the leader commits, the in-sync set names the leader alone, and
//! only a forced promotion (`seqstreamd --promote --accept-loss`,
//! [`seqstream_election::force_promotion`]) makes a standby lead.
//!
//! **The in-sync set** (`<prefix>/in-sync` in etcd): the members that hold every released
//! frame, the only ones that may take over, and the standbys release waits for. A winning
//! member's campaign records it for its term (the set it read, plus itself); while it leads,
//! this module keeps it true:
//! - a standby joins it once it has acked everything released, and at least what the leader
//!   held when its term began (a member of the set at that moment is in it already);
//! - under `degrade_after_ms`, a standby that has been behind without acking for that long
//!   leaves it: first the leader records a set without it in etcd, and only once etcd has
//!   confirmed that does the release stop waiting for it ([`Release::set_gating`]) — so a
//!   standby missing released frames is never named. With nobody left gating, release
//!   follows the committed position: the group runs on its leader alone, and etcd says
//!   that no standby may take over. Without `degrade_after_ms`, release blocks instead;
//! - a standby that left gates again once it has caught up with the released position; the
//!   release is frozen for a moment (at most 20 ms, `FREEZE_MAX_NS`) when it comes within
//!   1 MiB (`FREEZE_WINDOW`), so that a steady stream cannot keep it just behind;
//! - **k of n** (`sync_standbys`, PostgreSQL's `FIRST k` synchronous standbys): the set
//!   names at most k of the standbys that gate and hold every released frame, live ones
//!   (a session open, an ack in this leadership) first. Once k named ones are live, every
//!   other standby stops gating, after etcd has confirmed a set without it: it replicates
//!   asynchronously and may not take over. When a named one is no longer live (its session
//!   ended), an asynchronous standby that holds every released frame gates again and is
//!   named in its place, and the dead one then stops gating. With k = n − 1, the default,
//!   every standby is named and none is ever made asynchronous.
//!
//! **Switchover** (planned, `seqstreamd --switchover`, [`seqstream_election::request_switchover`]):
//! the leader, told by its election ([`Fence::handover`]) to hand over to an in-sync member,
//! stops sequencing (datagrams wait in its socket or are resent by the forwarders to the next
//! leader), waits until that member has acked its committed position, and resigns; the target
//! campaigns at once. A target that does not catch up within 2 s (`HANDOVER_MAX_NS`) makes the
//! leader abandon the request and sequence again.
//!
//! **Eligibility** (whether the member may campaign, [`Election::set_eligible`]): a member
//! whose store held frames when it started is eligible (under `standby-ack` an intact store
//! holds every released frame), and so is one that has caught up with a leader
//! ([`Follower::caught_up`]); a member that starts with an empty store is not, unless it is
//! the `bootstrap` member of a new group. A member catching up into a store it began empty
//! keeps a marker file (`<store>.catching-up`) until it has caught up, so a restart half way
//! does not make a partial store eligible.
//!
//! **Rejoin**: a deposed leader that comes back holding frames its successor never had (an
//! unreleased tail) is refused by the new leader as diverged and told where the histories
//! agree; its follower ([`FollowerConfig::rejoin`]) cuts the tail there once the leader
//! accepts that position, and follows.
//!
//! What this module never does: link etcd into the data path (the sequencer reads the
//! election's [`Fence`] through `LeaderGate`: atomics and a clock read), write the store
//! itself (its sequencer and follower do), or merge two histories.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use seqstream_agent::counters::{Counter, CountersWriter};
use seqstream_agent::daemon::{LimitedWarn, Role, RoleContext};
use seqstream_agent::host::{Hosted, Placement};
use seqstream_agent::{Agent, AgentError, DutyCycle, Idle};
use seqstream_election::{Election, ElectionConfig, ElectionStats, Fence, LeaderRecord, NodeSet};
use seqstream_replication::follower::{AckTiming, Follower, FollowerConfig, GROUP_RECONNECT_MIN};
use seqstream_replication::release::{Release, MAX_STANDBYS};
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_sequencer::cli::SequencerArgs;
use seqstream_sequencer::sequencer::{Sequencer, SequencerConfig};
use seqstream_sequencer::source_positions::SourcePositions;

/// How often (ns, by the duty cycle's clock) a member looks at its election and its state.
const STEER_EVERY_NS: u64 = 1_000_000;

/// Most frames of its store a standby reads for its source positions in one duty cycle: a
/// bound on what that reading adds to a cycle (and to the ack it may delay). A follower that
/// writes more in a cycle leaves the rest for idle cycles, or for the promotion to read.
const POSITIONS_PER_CYCLE: usize = 1024;

/// How close (bytes) a standby that left the in-sync set must come to the released position
/// for the leader to freeze release until it gets there.
const FREEZE_WINDOW: u64 = 1 << 20;
/// The longest a leader keeps release frozen for one standby (ns); after a freeze that did
/// not bring it in, the next waits [`FREEZE_BACKOFF_NS`].
const FREEZE_MAX_NS: u64 = 20_000_000;
const FREEZE_BACKOFF_NS: u64 = 1_000_000_000;
/// The longest a leader waits (ns) for a switchover's target to hold everything; and the
/// longest a leader that resigned for one waits for the target to lead before it may
/// campaign again.
const HANDOVER_MAX_NS: u64 = 2_000_000_000;

/// One member of the group, as every member's file lists it: `NODE=REPLICATION_ADDRESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSpec {
    /// Its node id (unique in the group, not 0).
    pub node_id: u32,
    /// Its replication server's address: where standbys and consumers connect while it leads.
    /// Its IP address is also the one it connects from as a standby.
    pub replication: SocketAddr,
}

impl FromStr for MemberSpec {
    type Err = String;

    /// Parses `NODE=ADDRESS`, e.g. `2=10.0.0.2:7101`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (id, addr) = s
            .split_once('=')
            .ok_or_else(|| format!("member {s:?}: use NODE=REPLICATION_ADDRESS"))?;
        let node_id: u32 = id
            .parse()
            .ok()
            .filter(|n| (1..=seqstream_election::MAX_NODE_ID).contains(n))
            .ok_or_else(|| format!("member {s:?}: the node id is a number from 1 to 64"))?;
        Ok(MemberSpec {
            node_id,
            replication: addr
                .parse()
                .map_err(|_| format!("member {s:?}: bad address"))?,
        })
    }
}

/// What a consumer of the group receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReleasePolicy {
    /// A frame goes to consumers once every in-sync standby holds it. The only policy with
    /// automatic failover: a member of the in-sync set holds everything ever released.
    StandbyAck,
    /// A frame goes to consumers as soon as the leader commits it (no standby's round trip).
    /// No standby is known to hold every released frame, so the in-sync set names the leader
    /// alone and nobody takes over by itself: when the leader dies, an operator promotes a
    /// standby with `seqstreamd --promote --accept-loss`, losing what only the leader held
    /// (consumers holding it are refused as diverged). A restarted leader leads again.
    Immediate,
}

/// The `[[sequencer_group]]` role: this host's member of a stream's sequencer group. Its
/// sequencer keys are a `[[sequencer]]`'s (`listen` is this member's datagram address).
#[derive(Debug, Clone, clap::Args)]
pub struct GroupArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub sequencer: SequencerArgs,
    /// This member's node id: one of `member`.
    #[arg(long)]
    pub node_id: u32,
    /// Every member of the group, this one included: NODE=REPLICATION_ADDRESS (repeat, or
    /// comma-separate). The same list on every member.
    #[arg(long = "member", value_delimiter = ',', required = true)]
    pub members: Vec<MemberSpec>,
    /// etcd client URLs (http://host:port; repeat, or comma-separate).
    #[arg(long = "etcd", value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// The group's key prefix in etcd (default /seqstream/stream-<stream_id>).
    #[arg(long)]
    pub etcd_prefix: Option<String>,
    /// Lease TTL of the leader key, whole seconds (at least 1): a dead leader is replaced
    /// after about this long.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub lease_ttl_s: u64,
    /// Release policy: standby-ack (consumers receive what every in-sync standby holds;
    /// automatic failover) or immediate (what the leader commits; failover by
    /// `--promote --accept-loss` only).
    #[arg(long, value_enum, default_value = "standby-ack")]
    pub release: ReleasePolicy,
    /// Degraded mode: a standby behind the leader that has acked nothing new for this long
    /// (ms) leaves the in-sync set (recorded in etcd first: it may then not take over) and
    /// release stops waiting for it; it rejoins once caught up. Unset: release blocks until
    /// every standby acks.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub degrade_after_ms: Option<u64>,
    /// k of n (PostgreSQL's `synchronous_standby_names = 'FIRST k (…)'`, Patroni's
    /// `synchronous_node_count`): release waits for this many standbys, the ones the in-sync
    /// set names; the others replicate without gating and may not take over. A named standby
    /// whose session ends is replaced by one that holds every released frame. Unset: every
    /// standby (1 to the number of standbys).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=MAX_STANDBYS as i64))]
    pub sync_standbys: Option<u8>,
    /// This member may lead with an empty store: set it on one member for a new group's
    /// first start, never on a member rebuilt after a loss.
    #[arg(long)]
    pub bootstrap: bool,
    /// Key file of the replication key (as `replicator`'s `--secret-file`); after it
    /// changes, the previous key stays valid for `key_overlap_ms`, as the sources' keys do.
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Addresses consumers (replicas on other hosts) may connect from (repeat, or
    /// comma-separate); the other members' addresses are allowed as standbys.
    #[arg(long = "allow", value_delimiter = ',')]
    pub allow: Vec<IpAddr>,
    /// Most replicas (standbys and consumers) served at once (1 to 100).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub max_consumers: u16,
}

impl GroupArgs {
    /// This member's entry in `members`, and the others'. Errors: a node listed twice, this
    /// node not listed, no other member.
    pub(crate) fn split_members(&self) -> Result<(MemberSpec, Vec<MemberSpec>)> {
        for (i, m) in self.members.iter().enumerate() {
            if self.members[..i].iter().any(|o| o.node_id == m.node_id) {
                bail!("member {} is listed twice", m.node_id);
            }
        }
        if self.release == ReleasePolicy::Immediate && self.degrade_after_ms.is_some() {
            bail!("degrade_after_ms is for release = \"standby-ack\": under \"immediate\" no standby gates release");
        }
        if self.release == ReleasePolicy::Immediate && self.sync_standbys.is_some() {
            bail!("sync_standbys is for release = \"standby-ack\": under \"immediate\" no standby gates release");
        }
        let me = self
            .members
            .iter()
            .find(|m| m.node_id == self.node_id)
            .copied()
            .with_context(|| format!("node_id {} is not one of the members", self.node_id))?;
        let others: Vec<MemberSpec> = self
            .members
            .iter()
            .filter(|m| m.node_id != self.node_id)
            .copied()
            .collect();
        if others.is_empty() || others.len() > MAX_STANDBYS {
            bail!(
                "a group has 2 to {} members, not {}",
                MAX_STANDBYS + 1,
                self.members.len()
            );
        }
        for m in &self.members {
            let ip = m.replication.ip();
            if ip.is_unspecified() {
                bail!("member {}: {ip} is no address: standbys are told apart by the address they connect from", m.node_id);
            }
            if self
                .members
                .iter()
                .any(|o| o.node_id != m.node_id && o.replication.ip() == ip)
            {
                bail!("members on one address ({ip}): standbys are told apart by the address they connect from");
            }
        }
        if let Some(k) = self
            .sync_standbys
            .filter(|&k| usize::from(k) > others.len())
        {
            bail!(
                "sync_standbys = {k}, but the group's other members (its standbys) number {}",
                others.len()
            );
        }
        Ok((me, others))
    }

    /// This member's election: its etcd endpoints, the group's prefix, its node id, the lease
    /// TTL.
    pub fn election_config(&self) -> ElectionConfig {
        ElectionConfig::new(self.etcd.clone(), self.prefix(), self.node_id)
            .lease_ttl(Duration::from_secs(self.lease_ttl_s))
    }

    /// The group's etcd key prefix.
    fn prefix(&self) -> String {
        self.etcd_prefix
            .clone()
            .unwrap_or_else(|| format!("/seqstream/stream-{}", self.sequencer.stream_id))
    }
}

impl Role for GroupArgs {
    const KIND: &'static str = "sequencer_group";
    const PLACEMENT_KEYS: &'static [&'static str] = SequencerArgs::PLACEMENT_KEYS;

    /// The member (sequencer or standby, on the sequencer's placement) and its replication
    /// server's acceptor (the slow path); the senders go to the context's sender host.
    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let (me, others) = self.split_members()?;
        let s = &self.sequencer;
        // Checked before anything starts: a standby with a configuration its sequencer would
        // refuse must fail now, not when it is promoted.
        let sequencer = s.config()?;
        let keys = seqstream_auth::Keyring::open(
            &self.secret_file,
            Duration::from_millis(s.keys.key_overlap_ms),
        )
        .context("reading the replication key")?;
        let standbys: Vec<IpAddr> = others.iter().map(|m| m.replication.ip()).collect();
        let release = Arc::new(
            Release::new(&standbys, &ctx.counters)
                .context("the members' addresses (standbys are told apart by address)")?,
        );
        let mut serve =
            ServerConfig::new(s.store.clone(), s.stream_id, me.replication, keys.clone());
        serve.allow = self.allow.iter().chain(&standbys).copied().collect();
        serve.sender_host = ctx.sender_host.clone();
        serve.max_consumers = self.max_consumers as usize;
        serve.release = Some(release.clone());
        let server = Server::bind(serve, &ctx.counters.scoped("serve "))
            .with_context(|| format!("serving {} on {}", s.store.display(), me.replication))?;

        let mut follow = FollowerConfig::new(s.store.clone(), s.stream_id, me.replication, keys);
        follow.bind = Some(me.replication.ip());
        follow.rejoin = true;
        // A refused connect is how a standby learns that its leader's process is gone (and
        // deposes it): after a session that ended before it wrote anything (a leader dying as
        // it was accepted) the next attempt comes after 5 ms, not the default 50.
        follow.reconnect_min = GROUP_RECONNECT_MIN;
        follow.store_config = follow.store_config.flush(s.flush);
        follow.max_segment_size = s.segment_size;
        // The leader's server counts this replica's acks as this member's (standby-ack
        // releases frames on them): it says it is a standby, and acknowledges at once.
        follow.standby = true;
        follow.ack = AckTiming::Immediate;

        let election = Election::start(self.election_config()).context("starting the election")?;
        let marker = catching_up_marker(&s.store);
        let holds_frames = store_holds_frames(&s.store)?;
        let eligible = (holds_frames && !marker.exists()) || (!holds_frames && self.bootstrap);
        if !eligible {
            std::fs::write(
                &marker,
                b"this member's store is catching up with its leader\n",
            )
            .with_context(|| format!("writing {}", marker.display()))?;
        }
        election.set_eligible(eligible);
        tracing::info!(stream_id = s.stream_id, node_id = self.node_id, members = self.members.len(), store = %s.store.display(), eligible, replication = %server.local_addr(), degrade_after_ms = ?self.degrade_after_ms, sync_standbys = ?self.sync_standbys, "sequencer group member starting");
        let stats = MemberCounters::new(&ctx.counters.scoped("member "))?;
        stats.eligible.set(eligible as u64);
        let others_len = others.len();
        let member = Member {
            role: format!("group stream {}", s.stream_id),
            node_id: self.node_id,
            fence: election.fence(),
            election,
            sequencer,
            positions: SourcePositions::new(&s.store),
            follow,
            others,
            release,
            counters: ctx.counters.clone(),
            stats,
            state: State::Idle,
            eligible,
            marker,
            degrade_after_ns: self.degrade_after_ms.map(|ms| ms * 1_000_000),
            sync_standbys: self.sync_standbys.map_or(others_len, usize::from),
            policy: self.release,
            solo_pending: None,
            in_sync: None,
            handover: None,
            handled_handover: 0,
            resigned_at_ns: None,
            deposed: None,
            depose_baseline: None,
            next_steer_ns: 0,
            unknown_leader: LimitedWarn::new("the leader is not a member of this group"),
        };
        Ok(vec![
            Hosted {
                agent: Box::new(member),
                placement: s.placement.placement(),
            },
            Hosted {
                agent: Box::new(server),
                placement: Placement {
                    core: None,
                    idle: Idle::Sleep(Duration::from_millis(1)),
                    on_error: s.placement.on_error,
                },
            },
        ])
    }
}

/// The marker a member keeps beside its store while it catches up into a store it began
/// empty: `<store>.catching-up`. A member with one never campaigns.
pub fn catching_up_marker(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".catching-up");
    PathBuf::from(name)
}

/// Whether the store at `dir` exists and holds at least one frame.
fn store_holds_frames(dir: &Path) -> Result<bool> {
    match seqstream_store::Tailer::open_with(dir, seqstream_store::TailerOptions::probe()) {
        Ok(t) => Ok(t.committed_position() > 0),
        Err(seqstream_store::StoreError::NoStore { .. }) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("opening {}", dir.display())),
    }
}

/// What the member is doing.
enum State {
    /// No leader known yet, and not leading.
    Idle,
    /// Following `leader`'s store.
    Standby {
        leader: u32,
        follower: Box<Follower>,
        /// The follower's [`cuts`](Follower::cuts) the member's source positions reflect.
        cuts_seen: u64,
        /// The follower's [`refused_connects`](Follower::refused_connects) the member has
        /// steered on.
        refusals_seen: u64,
    },
    /// Sequencing in a term, fenced by the election.
    Leading(Box<Sequencer>, u32),
}

impl State {
    fn gauge(&self) -> u64 {
        match self {
            State::Idle => 0,
            State::Standby { .. } => 1,
            State::Leading(..) => 2,
        }
    }
}

/// The member's counters (`<role> member …`), mirrored from its state and its election.
struct MemberCounters {
    state: Counter,
    eligible: Counter,
    term: Counter,
    leader: Counter,
    promotions: Counter,
    demotions: Counter,
    campaigns: Counter,
    terms_won: Counter,
    keepalive_failures: Counter,
    lapses: Counter,
    etcd_errors: Counter,
    barred: Counter,
    in_sync: Counter,
    in_sync_writes: Counter,
    in_sync_drops: Counter,
    in_sync_rejoins: Counter,
    made_async: Counter,
    release_freezes: Counter,
    switchovers: Counter,
    switchovers_abandoned: Counter,
    depositions: Counter,
}

impl MemberCounters {
    fn new(w: &CountersWriter) -> Result<MemberCounters> {
        Ok(MemberCounters {
            state: w.gauge("state (0 idle 1 standby 2 leader)")?,
            eligible: w.gauge("eligible")?,
            term: w.gauge("leader term")?,
            leader: w.gauge("leader node")?,
            promotions: w.counter("promotions")?,
            demotions: w.counter("demotions")?,
            campaigns: w.counter("campaigns")?,
            terms_won: w.counter("terms won")?,
            keepalive_failures: w.counter("keepalive failures")?,
            lapses: w.counter("lapses")?,
            etcd_errors: w.counter("etcd errors")?,
            barred: w.counter("campaigns barred (not in sync)")?,
            in_sync: w.gauge("in-sync set (bit n-1: node n)")?,
            in_sync_writes: w.counter("in-sync writes")?,
            in_sync_drops: w.counter("in-sync drops")?,
            in_sync_rejoins: w.counter("in-sync rejoins")?,
            made_async: w.counter("standbys made async")?,
            release_freezes: w.counter("release freezes")?,
            switchovers: w.counter("switchovers")?,
            switchovers_abandoned: w.counter("switchovers abandoned")?,
            depositions: w.counter("leaders deposed")?,
        })
    }

    fn mirror(&self, fence: &Fence, stats: ElectionStats) {
        let leader = fence.leader();
        self.term.set(leader.map_or(0, |l| l.term as u64));
        self.leader.set(leader.map_or(0, |l| l.node_id as u64));
        self.campaigns.set(stats.campaigns);
        self.terms_won.set(stats.terms_won);
        self.keepalive_failures.set(stats.keepalive_failures);
        self.lapses.set(stats.lapses);
        self.etcd_errors.set(stats.etcd_errors);
        self.barred.set(stats.barred);
        self.in_sync_writes.set(stats.in_sync_writes);
        self.in_sync.set(fence.in_sync().unwrap_or_default().0);
        self.depositions.set(stats.depositions);
    }
}

/// One member of a sequencer group: leads, follows the leader, or waits for one.
pub struct Member {
    role: String,
    node_id: u32,
    election: Election,
    fence: Fence,
    /// The sequencer this member opens when it wins a term.
    sequencer: SequencerConfig,
    /// The follower it runs as a standby (its upstream set to the leader's address).
    follow: FollowerConfig,
    /// Each source's next `source_seq` in the member's store, read while it is a standby
    /// ([`POSITIONS_PER_CYCLE`] frames a cycle) so that its promotion reads only the rest.
    positions: SourcePositions,
    others: Vec<MemberSpec>,
    release: Arc<Release>,
    counters: CountersWriter,
    stats: MemberCounters,
    state: State,
    eligible: bool,
    marker: PathBuf,
    /// `degrade_after_ms` in ns; `None`: release blocks while a standby is behind.
    degrade_after_ns: Option<u64>,
    /// How many standbys the in-sync set names and release waits for (k of n; n: every
    /// standby).
    sync_standbys: usize,
    /// The release policy.
    policy: ReleasePolicy,
    /// Under `immediate`, leading: the publication of the in-sync set naming this leader
    /// alone, until etcd confirms it (standbys gate release meanwhile).
    solo_pending: Option<u64>,
    /// While leading: the in-sync set's bookkeeping.
    in_sync: Option<InSync>,
    /// While handing over: to whom, and since when.
    handover: Option<Handover>,
    /// The number of the last switchover request acted on ([`Fence::handover`]).
    handled_handover: u32,
    /// When this member resigned for a switchover, until another member leads.
    resigned_at_ns: Option<u64>,
    /// The leadership this member last asked etcd to end as dead ([`Election::depose`]).
    deposed: Option<LeaderRecord>,
    /// The leadership this standby follows and its follower's refused connects when it first
    /// saw it: only a refusal after that counts against it (not one left over from a
    /// predecessor of the same node).
    depose_baseline: Option<(LeaderRecord, u64)>,
    next_steer_ns: u64,
    unknown_leader: LimitedWarn,
}

/// A switchover under way: the leader waits for standby `index` (node `to`) to hold
/// everything it committed.
struct Handover {
    to: u32,
    index: usize,
    since_ns: u64,
}

/// A leader's bookkeeping of the in-sync set (see the module docs). Standby `i` is
/// `others[i]`, as in the [`Release`].
struct InSync {
    /// The set etcd holds, as this leader last had it confirmed.
    recorded: NodeSet,
    /// A publication not confirmed yet: its generation and set.
    pending: Option<(u64, NodeSet)>,
    /// Standbys in the set when this leadership began and since: they hold every released
    /// frame.
    trusted: NodeSet,
    /// The committed position when this leadership began: a standby outside the set joins
    /// it only once it holds this much (everything an earlier leader may have released).
    floor: u64,
    /// Per standby: its last ack, and since when (ns) it has been behind without a new one.
    acks: Vec<(u64, u64)>,
    /// Per standby that left the set: its ack when it left. It may come back only once it
    /// acks something else (it is alive), so a dead standby whose last ack happens to equal
    /// the released position does not come and go.
    left_at: Vec<Option<u64>>,
    /// A freeze of release for standby `.0`, since `.1` (ns).
    freeze: Option<(usize, u64)>,
    no_freeze_until_ns: u64,
    /// The standbys the next set may name, by index: a buffer kept across steers (one a
    /// millisecond) so that a leader allocates nothing in its steady state.
    named: Vec<usize>,
}

impl Member {
    /// Looks at the election and acts on it: promotes, follows a new leader, steps down, or
    /// becomes eligible. Returns the work done.
    fn steer(&mut self, now_ns: u64) -> Result<usize, AgentError> {
        self.stats.mirror(&self.fence, self.fence.stats());
        self.stats.state.set(self.state.gauge());
        let leading = self.fence.term_if_leading();
        let other_leader = self
            .fence
            .leader()
            .map(|l| l.node_id)
            .filter(|&n| n != self.node_id);
        match &mut self.state {
            State::Leading(sequencer, _) => {
                self.release
                    .observe_committed(sequencer.appender().position());
                if let Some(leader) = other_leader {
                    tracing::warn!(role = %self.role, leader, "another member leads: stepping down to standby");
                    self.stats.demotions.incr();
                    self.close_state()?;
                    self.follow(leader)?;
                    return Ok(1);
                }
            }
            State::Standby {
                leader, follower, ..
            } => {
                // The leader's host refuses connections to its replication address: its
                // process is gone. A member that may take over ends its lease now rather than
                // a TTL later (see `Election::depose` for why this is safe).
                let record = self.fence.leader().filter(|l| l.node_id == *leader);
                let in_sync = self
                    .fence
                    .in_sync()
                    .is_none_or(|s| s.contains(self.node_id));
                let refusals = follower.refused_connects();
                if record.is_some() && self.depose_baseline.map(|b| b.0) != record {
                    self.depose_baseline = record.map(|r| (r, refusals));
                }
                let fresh = self.depose_baseline.is_some_and(|b| refusals > b.1);
                if let Some(dead) = record.filter(|&r| {
                    follower.upstream_refused()
                        && fresh
                        && self.eligible
                        && in_sync
                        && self.deposed != Some(r)
                }) {
                    tracing::warn!(role = %self.role, leader = dead.node_id, term = dead.term, "the leader's host refuses connections to its replication address (its process is gone): asking etcd to end its lease");
                    self.deposed = Some(dead);
                    self.election.depose(dead);
                }
                if leading.is_none() {
                    if !self.eligible && follower.caught_up() {
                        self.eligible = true;
                        self.election.set_eligible(true);
                        self.stats.eligible.set(1);
                        std::fs::remove_file(&self.marker).map_err(|e| {
                            AgentError::from(format!("removing {}: {e}", self.marker.display()))
                        })?;
                        tracing::info!(role = %self.role, position = follower.position(), "caught up with the leader: eligible");
                    }
                    match other_leader {
                        Some(l) if l != *leader => {
                            // The same replica follows the new leader: reopening it would
                            // validate the whole store again.
                            if let Some(m) = self.others.iter().find(|m| m.node_id == l) {
                                follower.retarget(m.replication);
                                *leader = l;
                                return Ok(1);
                            }
                            self.close_state()?;
                            self.follow(l)?;
                            return Ok(1);
                        }
                        _ => return Ok(0),
                    }
                }
            }
            State::Idle => {
                if leading.is_none() {
                    if let Some(l) = other_leader {
                        self.follow(l)?;
                        return Ok(1);
                    }
                    return Ok(0);
                }
            }
        }
        // A term this member does not lead yet, or a new one won while it still held the last
        // (its fence lapsed, it won again): a fresh leadership, its bookkeeping anew.
        if let Some(term) =
            leading.filter(|&t| !matches!(self.state, State::Leading(_, l) if l == t))
        {
            self.promote(term, now_ns)?;
            return Ok(1);
        }
        if let Some(generation) = self.solo_pending {
            if self.fence.in_sync_published(generation) {
                self.solo_pending = None;
                tracing::info!(role = %self.role, "etcd names this leader alone in the in-sync set: release no longer waits for standbys");
                self.ungate_all();
            }
        }
        if let State::Leading(sequencer, _) = &self.state {
            let committed = sequencer.appender().position();
            self.keep_in_sync(committed, now_ns);
            self.hand_over(committed, now_ns);
        }
        if let Some(at) = self.resigned_at_ns {
            if other_leader.is_none() && now_ns.saturating_sub(at) >= HANDOVER_MAX_NS {
                tracing::warn!(role = %self.role, "no member took over after the switchover: campaigning again");
                self.resigned_at_ns = None;
                self.election.set_eligible(self.eligible);
            }
        }
        Ok(0)
    }

    /// Whether standby `index` (node `node`) gates release and etcd holds an in-sync set
    /// naming it, with no other publication in flight: a switchover may hand over to it.
    fn gating_in_sync(&self, index: usize, node: u32) -> bool {
        self.release.gating() & (1 << index) != 0
            && self
                .in_sync
                .as_ref()
                .is_some_and(|s| s.pending.is_none() && s.recorded.contains(node))
    }

    /// The leader's part in a switchover (see the module docs): takes a new request, and
    /// resigns once the target holds everything, or gives up.
    fn hand_over(&mut self, committed: u64, now: u64) {
        if let Some((number, to)) = self.fence.handover() {
            if number != self.handled_handover {
                self.handled_handover = number;
                match self.others.iter().position(|m| m.node_id == to) {
                    Some(index) if self.gating_in_sync(index, to) => {
                        tracing::info!(role = %self.role, to, committed, "switchover: sequencing paused until the target holds everything");
                        self.handover = Some(Handover {
                            to,
                            index,
                            since_ns: now,
                        });
                    }
                    _ => {
                        self.stats.switchovers_abandoned.incr();
                        tracing::warn!(role = %self.role, to, "switchover refused: the target is not an in-sync member");
                    }
                }
            }
        }
        let Some(h) = &self.handover else {
            return;
        };
        let acked = self.release.acked(h.index);
        if !self.gating_in_sync(h.index, h.to) {
            tracing::warn!(role = %self.role, to = h.to, "switchover abandoned: the target left the in-sync set; sequencing again");
            self.stats.switchovers_abandoned.incr();
            self.handover = None;
        } else if acked >= committed {
            tracing::info!(role = %self.role, to = h.to, position = committed, "switchover: the target holds everything; resigning");
            self.stats.switchovers.incr();
            self.handover = None;
            self.resigned_at_ns = Some(now);
            self.election.resign();
        } else if now.saturating_sub(h.since_ns) >= HANDOVER_MAX_NS {
            tracing::warn!(role = %self.role, to = h.to, acked, committed, "switchover abandoned: the target did not catch up in time; sequencing again");
            self.stats.switchovers_abandoned.incr();
            self.handover = None;
        }
    }

    /// The leader's part in the in-sync set (see the module docs): who joins, who leaves and
    /// when, which k of the standbys it names, what etcd is asked to record, and the release
    /// freezes.
    fn keep_in_sync(&mut self, committed: u64, now: u64) {
        let Some(sync) = self.in_sync.as_mut() else {
            return;
        };
        if let Some((generation, set)) = sync.pending {
            if self.fence.in_sync_published(generation) {
                sync.recorded = set;
                sync.pending = None;
            }
        }
        let released = self.release.released();
        let gating = self.release.gating();
        let need = released.max(sync.floor);
        // A standby is live while it has a session open and has said, in this leadership,
        // what it holds.
        let live = |i: usize| self.release.connected(i) && self.release.reported(i);
        // The gating standbys that hold every released frame: those the set may name.
        let mut named = std::mem::take(&mut sync.named);
        named.clear();
        let mut stalled = NodeSet::default();
        for (i, m) in self.others.iter().enumerate() {
            let ack = self.release.acked(i);
            let (last, since) = &mut sync.acks[i];
            if ack != *last || ack >= committed {
                (*last, *since) = (ack, now);
            }
            if gating & (1 << i) == 0 {
                continue;
            }
            if self
                .degrade_after_ns
                .is_some_and(|d| now.saturating_sub(*since) >= d)
            {
                stalled.insert(m.node_id);
            } else if sync.trusted.contains(m.node_id)
                // `reported` before the ack: an ack it reports was stored before it.
                && self.release.reported(i)
                && self.release.acked(i) < released
            {
                // It came back with less than was released (a host that crashed before
                // its page cache reached the disk): in sync no more.
                sync.trusted.remove(m.node_id);
                tracing::warn!(role = %self.role, standby = m.node_id, resumed = ack, released, "standby resumed below the released position: it lost frames; not in sync until it catches up");
            } else if sync.trusted.contains(m.node_id) || ack >= need {
                named.push(i);
            }
        }
        // k of n: the set names at most `sync_standbys` of them, live ones first, then those
        // etcd names already (no needless change), then by index.
        let order = |i: &usize| {
            let i = *i;
            (!live(i), !sync.recorded.contains(self.others[i].node_id), i)
        };
        // Live ones sort first: the k named would hold this many of them.
        let live_named = named
            .iter()
            .filter(|&&i| live(i))
            .count()
            .min(self.sync_standbys);
        // Standbys that do not gate join while fewer than k named ones are live (with every
        // standby named, any that does not gate is missing: always). One that joins is named
        // in the same publication, in place of a named one that is not live.
        let mut wanted = self.sync_standbys.saturating_sub(live_named);
        for (i, m) in self.others.iter().enumerate() {
            let ack = self.release.acked(i);
            if wanted == 0 || gating & (1 << i) != 0 || sync.left_at[i] == Some(ack) {
                continue;
            }
            if ack >= need && self.release.set_gating(i, true) {
                sync.left_at[i] = None;
                self.stats.in_sync_rejoins.incr();
                sync.acks[i].1 = now;
                tracing::info!(role = %self.role, standby = m.node_id, position = ack, "standby caught up: release waits for it again");
                named.push(i);
                wanted -= 1;
            } else if sync.freeze.is_none()
                && now >= sync.no_freeze_until_ns
                && ack >= sync.floor
                && released.saturating_sub(ack) <= FREEZE_WINDOW
            {
                self.release.freeze(true);
                sync.freeze = Some((i, now));
                self.stats.release_freezes.incr();
            }
        }
        named.sort_by_key(order);
        named.truncate(self.sync_standbys);
        let live_named = named.iter().filter(|&&i| live(i)).count();
        let mut target = NodeSet::of([self.node_id]);
        for &i in &named {
            target.insert(self.others[i].node_id);
        }
        if let Some((i, since)) = sync.freeze {
            let joined = self.release.gating() & (1 << i) != 0;
            if joined || now.saturating_sub(since) >= FREEZE_MAX_NS {
                self.release.freeze(false);
                sync.freeze = None;
                if !joined {
                    sync.no_freeze_until_ns = now + FREEZE_BACKOFF_NS;
                }
            }
        }
        if sync.pending.map_or(sync.recorded, |(_, set)| set) != target {
            let generation = self.election.publish_in_sync(target);
            sync.pending = Some((generation, target));
        }
        // A standby stops gating only once etcd confirmed the latest set, without it: a
        // stalled one (degraded mode), and one beyond the k named while k named ones are
        // live (k of n; with every standby named there is none).
        if sync.pending.is_none() {
            let gating = self.release.gating();
            for (i, m) in self.others.iter().enumerate() {
                let is_stalled = stalled.contains(m.node_id);
                let beyond = live_named >= self.sync_standbys && !target.contains(m.node_id);
                if !(is_stalled || beyond)
                    || gating & (1 << i) == 0
                    || sync.recorded.contains(m.node_id)
                    || !self.release.set_gating(i, false)
                {
                    continue;
                }
                sync.trusted.remove(m.node_id);
                sync.left_at[i] = Some(sync.acks[i].0);
                if is_stalled {
                    self.stats.in_sync_drops.incr();
                    tracing::warn!(role = %self.role, standby = m.node_id, acked = sync.acks[i].0, committed, in_sync = %sync.recorded, "standby behind for degrade_after_ms: left the in-sync set (recorded in etcd; it may not take over until it catches up), release no longer waits for it");
                } else {
                    self.stats.made_async.incr();
                    tracing::info!(role = %self.role, standby = m.node_id, acked = sync.acks[i].0, in_sync = %sync.recorded, sync_standbys = self.sync_standbys, "the in-sync set names enough live standbys: this one replicates without gating release (it may not take over)");
                }
            }
        }
        sync.named = named;
    }

    /// Under `immediate`: no standby gates release any more.
    fn ungate_all(&self) {
        for i in 0..self.others.len() {
            self.release.set_gating(i, false);
        }
    }

    /// Ends the current state's bookkeeping and returns its agent, leaving `Idle`.
    fn take_state(&mut self) -> State {
        self.release.set_serving(false);
        self.in_sync = None;
        self.handover = None;
        self.solo_pending = None;
        std::mem::replace(&mut self.state, State::Idle)
    }

    /// Ends the current state's agent (its store closed, its socket shut).
    fn close_state(&mut self) -> Result<(), AgentError> {
        match self.take_state() {
            State::Idle => Ok(()),
            State::Standby { mut follower, .. } => follower.on_close(),
            State::Leading(mut sequencer, _) => sequencer.on_close(),
        }
    }

    /// Becomes a standby of `leader`.
    fn follow(&mut self, leader: u32) -> Result<(), AgentError> {
        let Some(m) = self.others.iter().find(|m| m.node_id == leader) else {
            self.unknown_leader
                .warn(format_args!("{}: node {leader} leads", self.role));
            return Ok(());
        };
        let mut cfg = self.follow.clone();
        cfg.upstream = m.replication;
        let follower = Follower::new(cfg, &self.counters)?;
        if self.resigned_at_ns.take().is_some() {
            // It resigned for a switchover, which made it ineligible: another leads now.
            self.election.set_eligible(self.eligible);
        }
        tracing::info!(role = %self.role, leader, upstream = %m.replication, position = follower.position(), "following the leader as a standby");
        self.state = State::Standby {
            leader,
            cuts_seen: follower.cuts(),
            refusals_seen: follower.refused_connects(),
            follower: Box::new(follower),
        };
        Ok(())
    }

    /// This member won `term`: ends its replica where it is and starts its sequencer on the
    /// same store, which starts the term. A standby hands over its replica's appender and
    /// the source positions it kept current, so the promotion reads only the frames those
    /// have not (no reopening, which validates every segment, and no reading of the whole
    /// store); otherwise the sequencer opens the store.
    fn promote(&mut self, term: u32, now_ns: u64) -> Result<(), AgentError> {
        let started = Instant::now();
        let appender = match self.take_state() {
            State::Standby { follower, .. } => follower.into_appender(),
            State::Leading(mut sequencer, _) => {
                sequencer.on_close()?;
                None
            }
            State::Idle => None,
        };
        let positions = std::mem::replace(
            &mut self.positions,
            SourcePositions::new(&self.sequencer.store),
        );
        let sequencer = match appender {
            Some(a) => Sequencer::resume(self.sequencer.clone(), &self.counters, a, positions)?,
            None => Sequencer::open(self.sequencer.clone(), &self.counters)?,
        }
        .fenced_by(Arc::new(self.fence.clone()))?;
        self.stats.promotions.incr();
        // A new epoch: standbys' acks of an earlier leadership name positions of a history
        // this member may have cut since. Every standby gates until it leaves the set; one
        // that does not gate is sent what is released and this member's history before its
        // term (final: every later leader holds it).
        self.release.new_epoch(sequencer.appender().position());
        self.release.set_serving(true);
        self.resigned_at_ns = None;
        let recorded = self.fence.in_sync_at_win();
        if self.policy == ReleasePolicy::Immediate {
            // Consumers receive what this member commits, whatever a standby holds: no
            // standby gates, and none may take over (only a forced promotion makes one).
            // While etcd still names another member (a set recorded under standby-ack), that
            // member could take over by itself: standbys gate until etcd names this one alone.
            let alone = NodeSet::of([self.node_id]);
            if recorded == alone {
                self.ungate_all();
            } else {
                self.solo_pending = Some(self.election.publish_in_sync(alone));
            }
            tracing::info!(role = %self.role, term, next_seq = sequencer.appender().next_seq(), listen = %sequencer.local_addr(), release = "immediate", promoted_in_us = started.elapsed().as_micros() as u64, "leading");
            self.state = State::Leading(Box::new(sequencer), term);
            return Ok(());
        }
        let mut trusted = recorded;
        trusted.remove(self.node_id);
        if self.degrade_after_ns.is_some() || trusted.nodes().len() >= self.sync_standbys {
            // A standby outside the set need not be waited for first: in degraded mode, or
            // when the set names k standbys already (k of n: the others are asynchronous). It
            // joins once caught up if it is wanted (it cannot take over meanwhile: the set
            // does not name it). With every standby named there is none.
            for (i, m) in self.others.iter().enumerate() {
                if !recorded.contains(m.node_id) {
                    self.release.set_gating(i, false);
                }
            }
        }
        self.in_sync = Some(InSync {
            recorded,
            pending: None,
            trusted,
            floor: sequencer.appender().position(),
            acks: vec![(0, now_ns); self.others.len()],
            left_at: vec![None; self.others.len()],
            freeze: None,
            no_freeze_until_ns: 0,
            named: Vec::with_capacity(self.others.len()),
        });
        tracing::info!(role = %self.role, term, next_seq = sequencer.appender().next_seq(), listen = %sequencer.local_addr(), in_sync = %recorded, promoted_in_us = started.elapsed().as_micros() as u64, "leading");
        self.state = State::Leading(Box::new(sequencer), term);
        Ok(())
    }
}

impl Agent for Member {
    fn role_name(&self) -> &str {
        &self.role
    }

    fn do_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        let mut work = match &mut self.state {
            State::Idle => 0,
            State::Standby {
                leader,
                follower,
                cuts_seen,
                refusals_seen,
            } => {
                let work = follower.do_work(cycle)?;
                if follower.cuts() != *cuts_seen {
                    *cuts_seen = follower.cuts();
                    self.positions.restart();
                }
                // A refused connect may mean the leader's process is gone (steering deposes
                // it), a won election is a promotion to make, and another leader one to
                // follow: steer now, not up to a steering interval later.
                if follower.refused_connects() != *refusals_seen
                    || self.fence.won_at().is_some()
                    || self.fence.leader().is_some_and(|l| {
                        l.node_id != *leader && self.others.iter().any(|m| m.node_id == l.node_id)
                    })
                {
                    *refusals_seen = follower.refused_connects();
                    self.next_steer_ns = 0;
                }
                work + self.positions.read(POSITIONS_PER_CYCLE, cycle.now_ns)?
            }
            // Handing over, or handed over: nothing more is sequenced, but what was is
            // flushed within the flush policy's bound.
            State::Leading(sequencer, _)
                if self.handover.is_some() || self.resigned_at_ns.is_some() =>
            {
                sequencer.do_paused_work()?;
                0
            }
            State::Leading(sequencer, _) => {
                let work = sequencer.do_work(cycle)?;
                if work > 0 {
                    self.release
                        .follow_committed(sequencer.appender().position());
                }
                work
            }
        };
        if cycle.now_ns >= self.next_steer_ns {
            self.next_steer_ns = cycle.now_ns + STEER_EVERY_NS;
            self.unknown_leader.tick();
            work += self.steer(cycle.now_ns)?;
        }
        Ok(work)
    }

    /// The late half of the role the member plays now.
    fn do_late_work(&mut self, cycle: &DutyCycle) -> Result<usize, AgentError> {
        match &mut self.state {
            State::Standby { follower, .. } => follower.do_late_work(cycle),
            State::Leading(..) if self.handover.is_some() || self.resigned_at_ns.is_some() => Ok(0),
            State::Leading(sequencer, _) => sequencer.do_late_work(cycle),
            State::Idle => Ok(0),
        }
    }

    /// Before the first cycle, and again when a runner restarts the member after an error
    /// (`on_error = "restart"`): its close resigned, which made it ineligible in the
    /// election, so it is made as eligible as its store is again (an intact or caught-up
    /// store), and campaigns or follows from its next steer.
    fn on_start(&mut self) -> Result<(), AgentError> {
        self.handover = None;
        self.resigned_at_ns = None;
        self.election.set_eligible(self.eligible);
        Ok(())
    }

    fn on_close(&mut self) -> Result<(), AgentError> {
        self.close_state()?;
        self.election.resign();
        Ok(())
    }
}
