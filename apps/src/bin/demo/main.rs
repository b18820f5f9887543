//! `demo`: seqstream's main job, end to end on one machine (see `scripts/demo.sh`).
//!
//! It starts, on four simulated hosts (network namespaces as root, loopback addresses
//! otherwise) and an etcd on a fifth, one `seqstreamd` each, from the host files the topology
//! module writes (the same topology as `config/`), and the applications:
//!
//! ```text
//!  seq host  : seqstreamd: member 1 of the sequencer groups md (stream 1) and orders
//!              (stream 2), leading; netfloor serve
//!  seq2 host : seqstreamd: member 2 of each, the standby
//!  host 1    : seqstreamd: replicas of 2 and 3, forwarder (routes 2); algo
//!  host 2    : seqstreamd: replicas of 1 and 2, compositor (stream 3 = 1 + 2, from those
//!              replicas) and its replication server, forwarder (routes 1 and 2); oms,
//!              feedhandler
//!  coord     : etcd (who leads each group, and its in-sync set)
//! ```
//!
//! Each group releases under `standby-ack`: a frame reaches a replica only once the
//! standby holds it. `--failover` kills the seq host's seqstreamd with SIGKILL half way
//! through the replay (half its packets or half its recorded span): each stream's standby
//! takes over, the forwarders resend what no replica showed, the replicas follow the new leader; once every
//! stream has its new leader the killed daemon starts again, cuts the tail it sequenced that
//! was never released, and follows as the standby. The summary says how many streams failed
//! over and, for each, the time from the kill to the new leader's first frame (its term-start
//! frame's timestamp).
//!
//! `--threading shared` (the default) runs each seqstreamd's roles on one thread,
//! `dedicated` gives each role and each replica's sender a thread of its own.
//!
//! With `--feeds itch` or `--feeds both` a second market-data stream joins: Nasdaq ITCH 5.0
//! (stream 4, `streams::ITCH`) from a second feed handler on host 2 (`feedhandler --feed
//! itch`, source 4), with its own sequencer group, a route and a replica on host 2, and the
//! compositor merges it too (stream 3 = 1 + 2 + 4 for `both`, 2 + 4 for `itch`, where stream
//! 1 and the CME feed handler are not started). The algo trades on CME books only and counts
//! the ITCH messages; with `itch` it sends no orders, and the audit expects none.
//!
//! It measures the network floor (netfloor), replays the captures through the feed handlers,
//! waits until the algo has seen all the market data and every order has its report, stops
//! the applications, waits until the composite holds every component message and every
//! store of a stream (both members', every replica) ends at the same position, stops the
//! standby host, then the leading one, then the application hosts, and then audits the
//! stores: each source's messages present exactly once, every order answered by exactly one
//! report, the composite holding each component message once, every store passing `storetool
//! verify`, every member's store and every replica byte-identical to the seq host's. The last
//! line printed is one JSON object; the exit status is 0 only if every check passed.
//! `--write-config DIR` writes the topology's host files for real hosts instead (the files
//! of `config/`).
//!
//! | module | owns |
//! |---|---|
//! | `topology` | what runs where: each host's seqstreamd file (the same as `config/`) |
//! | `seqstream_apps::net` | the simulated hosts: network namespaces on a bridge, or loopback addresses |
//! | `procs` | the child processes: logs, stop, kill on every way out |
//! | `report` | the audit of the stopped run and its JSON line |
//! | this file | the orchestration: start, measure the floor, replay, fail over, stop |

mod procs;
mod report;
mod topology;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use seqstream_apps::audit;
use seqstream_apps::streams::{COMPOSITE, ITCH};
use seqstream_feeds::mdp3::{Arbiter, Arbitration};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_store::digest::digest;
use serde_json::{json, Value};

use procs::Procs;
use seqstream_apps::net::{Host, Network, NetworkKind};
use topology::{stream_name, Site, Threading, ITCH_SOURCE, SEQ_HOSTS};

/// The market-data feeds a run replays.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Feeds {
    /// CME MDP3 only (stream 1).
    Cme,
    /// Nasdaq ITCH 5.0 only (stream 4): the algo sees no CME book and sends no orders.
    Itch,
    /// Both, in one composite with the order flow.
    Both,
}

impl Feeds {
    fn cme(self) -> bool {
        self != Feeds::Itch
    }
    fn itch(self) -> bool {
        self != Feeds::Cme
    }
    fn name(self) -> &'static str {
        match self {
            Feeds::Cme => "cme",
            Feeds::Itch => "itch",
            Feeds::Both => "both",
        }
    }
}

#[derive(Parser)]
#[command(
    name = "demo",
    version,
    about = "Run the whole seqstream topology on the CME capture and audit the result"
)]
struct Cli {
    /// The MDP3 capture to replay.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng"))]
    capture: PathBuf,
    /// Replay only the first N frames of the MDP3 capture.
    #[arg(long)]
    max_frames: Option<usize>,
    /// The market-data feeds to replay, each into its own stream.
    #[arg(long, value_enum, default_value = "cme")]
    feeds: Feeds,
    /// The ITCH 5.0 captures (a file or a directory of them) to replay with --feeds itch|both.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/nasdaq-itch50/v5.0"))]
    itch_capture: PathBuf,
    /// Replay pace.
    #[arg(long, value_enum, default_value = "recorded")]
    pace: Pace,
    /// Speed-up of the recorded pace (the CME capture spans 304 s, the ITCH captures 563 s).
    #[arg(long, default_value_t = 20.0)]
    speed: f64,
    /// How the hosts are simulated.
    #[arg(long, value_enum, default_value = "auto")]
    network: NetworkKind,
    /// Where the binaries are (default: this program's directory).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Working directory for stores, outboxes and logs (default: a new temporary one,
    /// removed at the end unless --keep).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep the working directory.
    #[arg(long)]
    keep: bool,
    /// First of the ports used (about 32 above it).
    #[arg(long, default_value_t = 47100)]
    port_base: u16,
    /// Segment size of every store, bytes (small segments exercise rolls): a multiple of 4096
    /// from 69632 (68 KiB, the shortest a sequencer takes) to under 4 GiB; the sequencer
    /// groups' stores take at least 905216 (884 KiB, a group member's shortest).
    #[arg(long, default_value_t = 4 << 20, value_parser = seqstream_sequencer::cli::parse_segment_size)]
    segment_size: u64,
    /// Round trips timed by netfloor.
    #[arg(long, default_value_t = 5000)]
    floor_count: u64,
    /// Idle strategy of every daemon thread and application. The default yields: on two
    /// cores a thread that parks waits for the scheduler to wake it behind the others (the
    /// end-to-end p50 was 1.0-1.8 ms with `backoff:20us`, 0.15-0.26 ms yielding, in one
    /// session). A parking strategy (`backoff:<N>us`) leaves the cores to other work.
    #[arg(long, default_value = "yield")]
    idle: String,
    /// Idle strategy of the feed handlers' replay agents. A paced replay waits for each
    /// packet's recorded time: sleeping between packets costs it only that much pace
    /// precision, and leaves the cores to the latency path.
    #[arg(long, default_value = "sleep:100us")]
    feed_idle: String,
    /// How each host's seqstreamd lays its roles on threads: shared (one thread per host)
    /// or dedicated (a thread per role and per replica's sender).
    #[arg(long, value_enum, default_value = "shared")]
    threading: Threading,
    /// Write the topology's host files for real hosts (10.0.0.1-4, etcd on 10.0.0.5-7,
    /// /var/lib/seqstream, pinned, busy-spinning: the files of config/) into this directory,
    /// and exit.
    #[arg(long)]
    write_config: Option<PathBuf>,
    /// Give up (and fail) after this many seconds (default: 60 plus the replay's duration).
    #[arg(long)]
    timeout_s: Option<u64>,
    /// Kill the seq host's seqstreamd (every stream's leader) with SIGKILL half way through
    /// the replay; the standbys on seq2 take over, and the killed daemon is started again
    /// to rejoin as their standby.
    #[arg(long)]
    failover: bool,
    /// The sequencer groups' lease TTL, s (a leader that dies is deposed at once by its
    /// standby; a silent one is replaced after about this).
    #[arg(long, default_value_t = 2)]
    lease_ttl_s: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pace {
    /// As fast as the feed handler's outbox accepts.
    Max,
    /// The capture's own spacing, divided by --speed.
    Recorded,
}

/// Where everything of one run lives.
struct Layout {
    work: PathBuf,
    bin: PathBuf,
}

impl Layout {
    fn store(&self, host: &str, stream: &str) -> PathBuf {
        self.work.join(host).join(stream)
    }
    fn file(&self, host: &str, name: &str) -> PathBuf {
        self.work.join(host).join(name)
    }
    fn bin(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
    fn counters(&self, name: &str) -> PathBuf {
        self.work.join("counters").join(format!("{name}.counters"))
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The value of counter `label` in the counters file `path` (0 if absent or unreadable yet).
fn counter(path: &Path, label: &str) -> u64 {
    seqstream_agent::counters::read(path)
        .ok()
        .and_then(|snap| snap.get(label))
        .unwrap_or(0)
}

/// Polls `done` every 20 ms until it holds; fails on timeout, on a stop request, or when a
/// process has died.
fn wait_until(
    what: &str,
    timeout: Duration,
    procs: &mut Procs,
    stop: &AtomicBool,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted while waiting for {what}");
        }
        if done()? {
            return Ok(());
        }
        procs.check_running()?;
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes a key file as the daemons accept it: readable by its owner only.
fn write_key(path: &Path, material: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating the key file {}", path.display()))?;
    writeln!(f, "{material}")?;
    Ok(())
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| s(path))?;
    serde_json::from_str(text.trim()).with_context(|| format!("{}: not JSON", path.display()))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// A group member's state counter (`<stream>-seq member state …`): 1 standby, 2 leader.
const MEMBER_STATE: &str = "member state (0 idle 1 standby 2 leader)";
/// A group member's view of its in-sync set (bit n-1: node n).
const MEMBER_IN_SYNC: &str = "member in-sync set (bit n-1: node n)";

/// A sequencer host's leadership of every stream, as its counters show it.
struct Leadership {
    file: PathBuf,
    /// `<stream>-seq member state` of every stream: 2 when it leads.
    states: Vec<String>,
    /// `<stream>-seq member in-sync set` of every stream, when both members must be in it.
    sets: Vec<String>,
}

impl Leadership {
    fn holds(&self) -> bool {
        self.states.iter().all(|l| counter(&self.file, l) == 2)
            && self.sets.iter().all(|l| counter(&self.file, l) == 3)
    }
}

/// One stream's failover under `--failover`.
struct Failover {
    stream: u32,
    /// The new leader's term.
    term: u32,
    /// From the SIGKILL to the new leader's term-start frame (its timestamp), ms.
    ms: f64,
}

/// The wall clock, ns since the Unix epoch (the clock of the frames' timestamps).
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The term and timestamp (ns) of the last term-start frame in the store `dir`.
fn last_term_start(dir: &Path) -> Result<Option<(u32, u64)>> {
    let mut t = seqstream_store::Tailer::open(dir).with_context(|| s(dir))?;
    let mut last = None;
    while let Some(f) = t.poll().with_context(|| s(dir))? {
        if let Some(start) = f.term_start() {
            last = Some((start.term, f.timestamp_ns()));
        }
    }
    Ok(last)
}

/// One run. Its fields drop in order: `procs` (every child killed) before `net` (the
/// namespaces removed).
struct Run<'a> {
    cli: &'a Cli,
    l: Layout,
    procs: Procs,
    net: Network,
    stop: std::sync::Arc<AtomicBool>,
    deadline: Instant,
    /// Each host's seqstreamd threads once everything had started: (host, thread names).
    threads: Vec<(&'static str, Vec<String>)>,
    /// `--failover` kills the leaders once the feed handler has replayed this many packets.
    kill_at_packets: u64,
    /// … or once this long has passed since the replay began, whichever comes first (half
    /// the replay's recorded span; zero under `--pace max`): a capture whose packets crowd its
    /// end would otherwise put the kill after the last of them.
    kill_after: Duration,
    /// What `--failover` did, per stream.
    failovers: Vec<Failover>,
    /// The feed handler's packets replayed when `--failover` killed the leaders.
    packets_at_kill: u64,
    /// Frames the killed leader cut when it rejoined (its `<stream>-seq frames cut`).
    frames_cut: u64,
}

impl Run<'_> {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The composite's components: host 2's replicas (stream id, store), in merge order
    /// (the topology's).
    fn components(&self) -> Vec<(u32, PathBuf)> {
        let site = self.site();
        site.sequenced()
            .into_iter()
            .map(|st| (st, site.store("h2", st)))
            .collect()
    }

    fn spawn(&mut self, name: &str, host: &Host, bin: &str, args: Vec<String>) -> Result<()> {
        let program = self.l.bin(bin);
        self.procs
            .spawn(name, host.netns.as_deref(), &program, &args)
    }

    fn wait_store(&mut self, dir: &Path) -> Result<()> {
        let left = self.left();
        wait_until(
            &format!("the store {}", dir.display()),
            left,
            &mut self.procs,
            &self.stop,
            || Ok(seqstream_store::layout::holds_store(dir)),
        )
    }

    /// The topology laid on this run's simulated hosts and work directory.
    fn site(&self) -> Site {
        let (net, cli) = (&self.net, self.cli);
        Site {
            cme: cli.feeds.cme(),
            itch: cli.feeds.itch(),
            seq_ip: [net.seq.ip, net.seq2.ip],
            host_ip: [net.h1.ip, net.h2.ip],
            client_ip: [net.client_ip(&net.h1), net.client_ip(&net.h2)],
            etcd: vec![format!("http://{}:{}", net.coord.ip, cli.port_base + 30)],
            lease_ttl_s: cli.lease_ttl_s,
            stores: |site, host| site.work.join(host),
            outboxes: |site, host| site.work.join(host),
            counters: |site, host| {
                Some(
                    site.work
                        .join("counters")
                        .join(format!("seqstreamd-{host}.counters")),
                )
            },
            secret: self.l.work.join("secret"),
            keys: self.l.work.join("keys"),
            work: self.l.work.clone(),
            port_base: cli.port_base,
            segment_size: cli.segment_size,
            // No heartbeats: once the applications stop nothing more is appended, so every
            // store of a stream can end identical (a heartbeat after the standby stopped
            // would stay in the leader's store alone).
            heartbeat_ms: None,
            threading: cli.threading,
            idle: cli.idle.clone(),
            pinned: false,
        }
    }

    /// Writes host `host`'s file and starts its seqstreamd.
    fn start_host(&mut self, host: &Host, text: &str) -> Result<()> {
        let file = self.l.file(host.name, "seqstreamd.toml");
        std::fs::write(&file, text).with_context(|| s(&file))?;
        let name = format!("seqstreamd-{}", host.name);
        self.spawn(&name, host, "seqstreamd", vec!["--config".into(), s(&file)])
    }

    /// Starts every daemon and application; returns once the feed handler may start.
    fn start(&mut self) -> Result<()> {
        let net = &self.net;
        let (seq, seq2, coord) = (net.seq.clone(), net.seq2.clone(), net.coord.clone());
        let (h1, h2) = (net.h1.clone(), net.h2.clone());
        let site = self.site();
        write_key(
            &site.secret,
            "seqstream demo replication key, fresh each run",
        )?;
        std::fs::create_dir_all(&site.keys)?;
        for id in Site::all_sources() {
            write_key(
                &site.source_key(id),
                &format!("seqstream demo key of source {id}, fresh each run"),
            )?;
        }
        let files = site.files();
        // Application hosts' outboxes first, so that each forwarder drains them from its
        // first cycle rather than from its next look for missing ones.
        for (h, host) in ["h1", "h2"].into_iter().enumerate() {
            for (name, source, stream) in site.outboxes_of(h) {
                let path = site.outbox(host, name);
                Outbox::open_or_create(&path, source, stream, 8 << 20, 4096)
                    .with_context(|| s(&path))?;
            }
        }
        self.start_etcd(&coord)?;
        // Member 1 of every group bootstraps it and leads; member 2 follows it as the standby
        // and joins the in-sync set once it holds everything released.
        self.start_host(&seq, &files[0].1)?;
        self.start_host(&seq2, &files[1].1)?;
        self.wait_leader(0, true)?;
        // Host 2 merges the composite from its replicas; host 1's replica of it follows host
        // 2's server, which refuses it until the composite exists.
        self.start_host(&h2, &files[3].1)?;
        self.wait_store(&site.store("h2", COMPOSITE))?;
        self.start_host(&h1, &files[2].1)?;
        let idle = self.cli.idle.clone();

        let args = vec![
            "--orders".into(),
            s(&self.l.store("h2", "orders")),
            "--outbox".into(),
            s(&self.l.file("h2", "oms.outbox")),
            "--source-id".into(),
            "21".into(),
            "--idle".into(),
            idle.clone(),
            "--summary".into(),
            s(&self.l.file("h2", "oms.json")),
            "--counters".into(),
            s(&self.l.counters("oms")),
        ];
        self.spawn("oms", &h2, "oms", args)?;
        let args = vec![
            "--composite".into(),
            s(&self.l.store("h1", "composite")),
            "--orders".into(),
            s(&self.l.store("h1", "orders")),
            "--outbox".into(),
            s(&self.l.file("h1", "algo.outbox")),
            "--source-id".into(),
            "11".into(),
            "--idle".into(),
            idle.clone(),
            "--summary".into(),
            s(&self.l.file("h1", "algo.json")),
            "--counters".into(),
            s(&self.l.counters("algo")),
        ];
        self.spawn("algo", &h1, "algo", args)?;
        // Every replica's follower has reached its upstream. (A replica is created only with
        // its first frame, and an idle composite stream sends none.)
        for (host, stream_id) in
            (0..2).flat_map(|h| site.replicas(h).into_iter().map(move |s| (h + 1, s)))
        {
            let counters = (site.counters)(&site, &format!("h{host}")).expect("demo counters");
            let label = format!("{}-rep connects", topology::stream_name(stream_id));
            let left = self.left();
            wait_until(
                &format!("host {host}'s follower of stream {stream_id} to connect"),
                left,
                &mut self.procs,
                &self.stop,
                || Ok(counter(&counters, &label) > 0),
            )?;
        }
        Ok(())
    }

    /// Starts etcd on the coordination host (its data in the work directory) and waits
    /// until it reports itself healthy (`etcdctl endpoint health`: it has elected itself, so
    /// the members' first calls do not time out).
    fn start_etcd(&mut self, coord: &Host) -> Result<()> {
        let (ip, port) = (coord.ip, self.cli.port_base + 30);
        let client = format!("http://{ip}:{port}");
        let peer = format!("http://{ip}:{}", self.cli.port_base + 31);
        let args: Vec<String> = [
            "--name",
            "demo",
            "--data-dir",
            &s(&self.l.work.join("etcd")),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("demo={peer}"),
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        .map(String::from)
        .to_vec();
        let program =
            std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
        self.procs
            .spawn("etcd", coord.netns.as_deref(), &program, &args)
            .context("etcd is Debian's etcd-server (scripts/deps.sh --tests installs it; ETCD_BIN names another binary)")?;
        let healthy = || {
            coord
                .command("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={client}"))
                .args(["endpoint", "health", "--command-timeout=500ms"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let left = self.left();
        wait_until(
            &format!("etcd on {client} to report itself healthy (etcdctl endpoint health; etcdctl is Debian's etcd-client)"),
            left,
            &mut self.procs,
            &self.stop,
            || Ok(healthy()),
        )
    }

    /// The counters file of host `host`'s seqstreamd.
    fn daemon_counters(&self, host: &str) -> PathBuf {
        let site = self.site();
        (site.counters)(&site, host).expect("the demo names every counters file")
    }

    /// Sequencer host `host`'s (0: `seq`, 1: `seq2`) counters file, and the label of
    /// `<stream>-seq <what>` for every stream.
    fn member_counters(&self, host: usize, what: &str) -> (PathBuf, Vec<String>) {
        let labels = self
            .site()
            .sequenced()
            .into_iter()
            .map(|st| format!("{}-seq {what}", stream_name(st)))
            .collect();
        (self.daemon_counters(SEQ_HOSTS[host]), labels)
    }

    /// What says that sequencer host `host` (0: `seq`, 1: `seq2`) leads every stream, and
    /// with `in_sync` that each group's in-sync set holds both members.
    fn leadership(&self, host: usize, in_sync: bool) -> Leadership {
        let (file, states) = self.member_counters(host, MEMBER_STATE);
        let (_, sets) = self.member_counters(host, MEMBER_IN_SYNC);
        Leadership {
            file,
            states,
            sets: if in_sync { sets } else { Vec::new() },
        }
    }

    /// Waits until sequencer host `host` leads every stream (see [`Run::leadership`]).
    fn wait_leader(&mut self, host: usize, in_sync: bool) -> Result<()> {
        let leadership = self.leadership(host, in_sync);
        let what = format!(
            "{} to lead every stream{}",
            SEQ_HOSTS[host],
            if in_sync {
                " with both members in sync"
            } else {
                ""
            }
        );
        let left = self.left();
        wait_until(&what, left, &mut self.procs, &self.stop, || {
            Ok(leadership.holds())
        })
    }

    /// Records the threads of each host's seqstreamd (from `/proc/<pid>/task`).
    fn sample_threads(&mut self) -> Result<()> {
        for host in ["seq", "seq2", "h1", "h2"] {
            let pid = self.procs.pid(&format!("seqstreamd-{host}"))?;
            let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))?
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect();
            names.sort();
            self.threads.push((host, names));
        }
        Ok(())
    }

    /// netfloor: one UDP one-way h1 → seq plus one TCP one-way seq → h1, per round trip
    /// (the path of an order without the standby's round trip).
    fn floor(&mut self) -> Result<Value> {
        let (seq, h1) = (self.net.seq.clone(), self.net.h1.clone());
        let port = self.cli.port_base + 21;
        let serve = vec![
            "serve".into(),
            "--udp".into(),
            format!("{}:{port}", self.net.seq.ip),
            "--tcp".into(),
            format!("{}:{port}", self.net.seq.ip),
        ];
        self.spawn("netfloor-serve", &seq, "netfloor", serve)?;
        let target = self.net.seq.ip;
        let ping = vec![
            "ping".into(),
            "--udp".into(),
            format!("{target}:{port}"),
            "--tcp".into(),
            format!("{target}:{port}"),
            "--bind".into(),
            format!("{}:0", h1.ip),
            "--count".into(),
            self.cli.floor_count.to_string(),
        ];
        self.spawn("netfloor-ping", &h1, "netfloor", ping)?;
        let left = self.left();
        self.procs.wait("netfloor-ping", left)?;
        self.procs.wait("netfloor-serve", Duration::from_secs(5))?;
        let out = self.procs.output("netfloor-ping")?;
        serde_json::from_str(out.trim()).context("netfloor's output")
    }

    /// The arguments every feed handler gets: pace, speed, idle, summary and counters.
    fn feed_args(&self, name: &str) -> Vec<String> {
        vec![
            "--pace".into(),
            match self.cli.pace {
                Pace::Max => "max".into(),
                Pace::Recorded => "recorded".into(),
            },
            "--speed".into(),
            self.cli.speed.to_string(),
            "--idle".into(),
            self.cli.feed_idle.clone(),
            "--summary".into(),
            s(&self.l.file("h2", &format!("{name}.json"))),
            "--counters".into(),
            s(&self.l.counters(name)),
        ]
    }

    /// Replays the captures (both feed handlers at once with `--feeds both`) and waits for
    /// the algo to have read all market data and the OMS to have answered every order.
    /// Returns the summaries of the CME and of the ITCH feed handler, each if it ran.
    fn replay(&mut self) -> Result<(Option<Value>, Option<Value>)> {
        let h2 = self.net.h2.clone();
        let feeds = self.cli.feeds;
        let mut names = Vec::new();
        if feeds.cme() {
            let mut args = vec![
                "--capture".into(),
                s(&self.cli.capture),
                "--outbox".into(),
                s(&self.l.file("h2", "feed.outbox")),
                "--source-id".into(),
                "1".into(),
            ];
            args.extend(self.feed_args("feedhandler"));
            if let Some(n) = self.cli.max_frames {
                args.extend(["--max-frames".into(), n.to_string()]);
            }
            self.spawn("feedhandler", &h2, "feedhandler", args)?;
            self.procs.may_finish("feedhandler")?;
            names.push("feedhandler");
        }
        if feeds.itch() {
            let mut args = vec![
                "--feed".into(),
                "itch".into(),
                "--capture".into(),
                s(&self.cli.itch_capture),
                "--outbox".into(),
                s(&self.l.file("h2", "itch.outbox")),
                "--source-id".into(),
                ITCH_SOURCE.to_string(),
                "--stream-id".into(),
                ITCH.to_string(),
            ];
            args.extend(self.feed_args("feedhandler-itch"));
            self.spawn("feedhandler-itch", &h2, "feedhandler", args)?;
            self.procs.may_finish("feedhandler-itch")?;
            names.push("feedhandler-itch");
        }
        if self.cli.failover {
            self.fail_over(names[0])?;
        }
        let left = self.left();
        self.procs.wait_all(&names, left)?;
        let summary = |name: &str| read_json(&self.l.file("h2", &format!("{name}.json")));
        let cme = feeds.cme().then(|| summary("feedhandler")).transpose()?;
        let itch = feeds
            .itch()
            .then(|| summary("feedhandler-itch"))
            .transpose()?;
        let md = cme.as_ref().map_or(0, |f| u(f, "messages"));
        let itch_md = itch.as_ref().map_or(0, |f| u(f, "messages"));
        let (algo, oms) = (self.l.counters("algo"), self.l.counters("oms"));
        let left = self.left();
        wait_until(
            "the algo to read all market data and the OMS to answer every order",
            left,
            &mut self.procs,
            &self.stop,
            || {
                let sent = counter(&algo, "orders sent");
                Ok(counter(&algo, "market data messages") == md
                    && counter(&algo, "itch messages") == itch_md
                    && counter(&algo, "execution reports") == sent
                    && counter(&algo, "orders seen in the replica") == sent
                    && counter(&oms, "execution reports sent") == sent)
            },
        )?;
        Ok((cme, itch))
    }

    /// `--failover`: once the feed handler `feed` has replayed `kill_at_packets` packets, or
    /// `kill_after` has passed (or it has finished), kills the seq host's seqstreamd with SIGKILL, waits until seq2 has
    /// started a newer term of every stream, records each stream's failover time (kill → the
    /// new term's term-start frame), and starts the killed daemon again; returns once it has
    /// caught up and is back in every group's in-sync set.
    fn fail_over(&mut self, feed: &str) -> Result<()> {
        let feed_counters = self.l.counters(feed);
        let began = Instant::now();
        let deadline = began + self.left();
        let due = |replayed: u64| {
            replayed >= self.kill_at_packets
                || (!self.kill_after.is_zero() && began.elapsed() >= self.kill_after)
        };
        while !due(counter(&feed_counters, "packets replayed")) && self.procs.running(feed)? {
            self.procs.check_running()?;
            if self.stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                bail!("interrupted or out of time before the failover");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let site = self.site();
        let streams = site.sequenced();
        let (seq_file, terms) = self.member_counters(0, "member leader term");
        let old_terms: Vec<u64> = terms.iter().map(|l| counter(&seq_file, l)).collect();
        self.packets_at_kill = counter(&feed_counters, "packets replayed");
        let killed_ns = wall_ns();
        self.procs.kill("seqstreamd-seq")?;
        println!(
            "== failover: SIGKILL to the seq host's seqstreamd, the leader of every stream ({} packets replayed)",
            self.packets_at_kill
        );
        // seq2's sequencer's `term` gauge moves once it has written the term-start frame.
        let (seq2_file, new_terms) = self.member_counters(1, "term");
        let left = self.left();
        wait_until(
            "seq2 to start a new term of every stream",
            left,
            &mut self.procs,
            &self.stop,
            || {
                Ok(new_terms
                    .iter()
                    .zip(&old_terms)
                    .all(|(l, old)| counter(&seq2_file, l) > *old))
            },
        )?;
        for stream in streams {
            let dir = site.store("seq2", stream);
            let (term, at_ns) = last_term_start(&dir)?
                .with_context(|| format!("{} holds no term-start frame", dir.display()))?;
            if at_ns < killed_ns {
                bail!("stream {stream}: seq2's last term-start frame (term {term}) is older than the kill");
            }
            let ms = (at_ns - killed_ns) as f64 / 1e6;
            println!(
                "   stream {stream} ({}): seq2 leads term {term}, its first frame {ms:.1} ms after the kill",
                stream_name(stream)
            );
            self.failovers.push(Failover { stream, term, ms });
        }
        // A supervisor would start it again: it finds a newer term, cuts the tail it
        // sequenced that was never released, follows seq2 and, once it holds everything
        // released, is back in the in-sync set (release resumes then: until it is, a
        // standby-ack leader with its only standby gone releases nothing).
        let seq = self.net.seq.clone();
        self.start_host(&seq, &site.files()[0].1)?;
        self.wait_leader(1, true)?;
        println!("== failover: the seq host is back, the in-sync standby of every stream");
        Ok(())
    }

    /// Stops everything so that every store ends complete: the applications; then, once
    /// the composite holds every component message and every store of each stream (both
    /// members', every replica) ends at the same position, the standby sequencer host and
    /// then the leading one (a leader stopping first would hand over to its standby, which
    /// would start a term of its own); then the application hosts.
    fn shut_down(&mut self) -> Result<(Value, Value)> {
        self.procs.stop("algo")?;
        self.procs.stop("oms")?;
        let composite = self.l.store("h2", "composite");
        let components = self.components();
        let components: Vec<(u32, &Path)> = components
            .iter()
            .map(|(id, p)| (*id, p.as_path()))
            .collect();
        let left = self.left();
        wait_until(
            "the compositor to merge everything",
            left,
            &mut self.procs,
            &self.stop,
            || {
                let a = audit::composite(&composite, &components)?;
                Ok(a.missing == 0)
            },
        )?;
        let pairs = self.replica_pairs();
        let left = self.left();
        wait_until(
            "every store of each stream to end at the same position",
            left,
            &mut self.procs,
            &self.stop,
            || {
                Ok(pairs
                    .iter()
                    .all(|(primary, copy)| match (digest(primary), digest(copy)) {
                        (Ok(a), Ok(b)) => a.end_position == b.end_position,
                        _ => false,
                    }))
            },
        )?;
        let leader = (0..2)
            .find(|&h| self.leadership(h, false).holds())
            .context("neither sequencer host leads every stream")?;
        let (seq_file, cuts) = self.member_counters(0, "frames cut");
        self.frames_cut = cuts.iter().map(|l| counter(&seq_file, l)).sum();
        for host in [SEQ_HOSTS[1 - leader], SEQ_HOSTS[leader]] {
            self.procs.stop(&format!("seqstreamd-{host}"))?;
        }
        for name in ["seqstreamd-h1", "seqstreamd-h2"] {
            self.procs.stop(name)?;
        }
        self.procs.stop_foreign("etcd")?;
        Ok((
            read_json(&self.l.file("h1", "algo.json"))?,
            read_json(&self.l.file("h2", "oms.json"))?,
        ))
    }

    /// Every pair of stores that must end byte-identical, (the reference, a copy): each
    /// sequenced stream's store on seq against seq2's and every replica; host 2's composite
    /// against host 1's replica of it.
    fn replica_pairs(&self) -> Vec<(PathBuf, PathBuf)> {
        let site = self.site();
        let mut pairs = Vec::new();
        for stream in site.sequenced() {
            let primary = site.store("seq", stream);
            pairs.push((primary.clone(), site.store("seq2", stream)));
            for h in site.replicated_to(stream) {
                pairs.push((primary.clone(), site.store(["h1", "h2"][h], stream)));
            }
        }
        pairs.push((site.store("h2", COMPOSITE), site.store("h1", COMPOSITE)));
        pairs
    }
}
fn main() -> Result<()> {
    let cli = Cli::parse();
    let started = Instant::now();
    let stop = seqstream_agent::daemon::stop_flag()?;
    let bin = match &cli.bin_dir {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no binary directory")?
            .to_path_buf(),
    };
    if let Some(dir) = &cli.write_config {
        return topology::write_real_hosts(dir, cli.feeds.cme(), cli.feeds.itch());
    }
    for b in ["seqstreamd", "feedhandler", "algo", "oms", "netfloor"] {
        if !bin.join(b).exists() {
            bail!("{} is missing: build the workspace first (cargo build --release --workspace --bins)", bin.join(b).display());
        }
    }
    // A temporary work dir is removed at the end unless --keep or the run failed.
    let mut temp = None;
    let work = match &cli.work_dir {
        Some(w) => {
            std::fs::create_dir_all(w)?;
            if std::fs::read_dir(w)?.next().is_some() {
                bail!("--work-dir {} is not empty: the stores of an earlier run would be read as part of this one", w.display());
            }
            w.clone()
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("seqstream-demo.")
                .tempdir()?;
            let path = t.path().to_path_buf();
            if cli.keep {
                let _ = t.keep();
            } else {
                temp = Some(t);
            }
            path
        }
    };
    for d in ["seq", "seq2", "h1", "h2", "counters"] {
        std::fs::create_dir_all(work.join(d))?;
    }
    // etcd wants its data directory private.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(work.join("etcd"))?;
    // Read the captures first: a bad file fails here, before anything starts, and their
    // spans size the default timeout.
    if !(cli.speed.is_finite() && cli.speed > 0.0) {
        bail!("--speed must be a positive number");
    }
    let span_s = |first: Option<u64>, last: Option<u64>| match (first, last, cli.pace) {
        (Some(a), Some(b), Pace::Recorded) => b.saturating_sub(a) as f64 / 1e9 / cli.speed,
        _ => 0.0,
    };
    let mut span = 0.0f64;
    // `--failover` kills the leaders half way through the first feed's packets or half way
    // through its recorded span, whichever comes first (or once it has replayed them all).
    let (mut kill_at_packets, mut kill_after_s) = (0, 0.0f64);
    if cli.feeds.cme() {
        let (packets, _) =
            seqstream_apps::feed::read_mdp3(std::slice::from_ref(&cli.capture), cli.max_frames)
                .with_context(|| format!("reading {}", cli.capture.display()))?;
        // The packets the feed handler replays: those A/B arbitration keeps.
        let mut arbiter = Arbiter::default();
        let kept = packets
            .iter()
            .filter(|p| arbiter.accept(p.msg_seq_num) != Arbitration::Duplicate)
            .count();
        kill_at_packets = kept as u64 / 2;
        span = span.max(span_s(
            packets.first().map(|p| p.sending_time_ns),
            packets.last().map(|p| p.sending_time_ns),
        ));
        kill_after_s = span / 2.0;
    }
    if cli.feeds.itch() {
        let files = seqstream_apps::feed::capture_files(std::slice::from_ref(&cli.itch_capture))?;
        let (packets, _, _) = seqstream_apps::feed::read_itch(&files, None)
            .with_context(|| format!("reading {}", cli.itch_capture.display()))?;
        let itch_span = span_s(
            packets.first().map(|p| p.timestamp_ns),
            packets.last().map(|p| p.timestamp_ns),
        );
        if !cli.feeds.cme() {
            kill_at_packets = packets.len() as u64 / 2;
            kill_after_s = itch_span / 2.0;
        }
        span = span.max(itch_span);
    }
    let timeout = Duration::from_secs(cli.timeout_s.unwrap_or(60 + span.ceil() as u64));
    let net = Network::of_kind(cli.network, &format!("ss{}", std::process::id() % 100_000))?;
    println!(
        "== seqstream demo: {} hosts, work dir {}",
        if net.is_netns() {
            "network-namespace"
        } else {
            "loopback"
        },
        work.display()
    );
    let mut run = Run {
        cli: &cli,
        l: Layout {
            work: work.clone(),
            bin,
        },
        net,
        procs: Procs::new(&work.join("logs"), stop.clone())?,
        stop,
        deadline: started + timeout,
        threads: Vec::new(),
        kill_at_packets,
        kill_after: Duration::from_secs_f64(kill_after_s),
        failovers: Vec::new(),
        packets_at_kill: 0,
        frames_cut: 0,
    };
    let result = (|| {
        run.start()?;
        run.sample_threads()?;
        for (host, names) in &run.threads {
            println!(
                "== {host}: seqstreamd, {} threads: {}",
                names.len(),
                names.join(", ")
            );
        }
        let streams = 1 + usize::from(cli.feeds.cme()) + usize::from(cli.feeds.itch());
        println!("== started ({} feeds, {} threading): etcd, 4 seqstreamd (2 sequencer hosts: {streams} sequencer groups of 2 members under standby-ack; 2 application hosts: replicas, forwarders, the compositor), algo, oms ({:.1} s)", cli.feeds.name(), cli.threading.name(), started.elapsed().as_secs_f64());
        let floor = run.floor()?;
        println!("== floor measured: {}", floor["udp_plus_tcp_oneway_ns"]);
        let (feed, itch_feed) = run.replay()?;
        if let Some(feed) = &feed {
            println!("== CME capture replayed: {} messages from {} packets ({} duplicate packets of the other feed dropped) in {} ms",
                u(feed, "messages"), u(feed, "packets"), u(feed, "duplicate_packets"), u(feed, "confirmed_ms"));
        }
        if let Some(f) = &itch_feed {
            println!("== ITCH captures replayed: {} messages from {} packets ({} MoldUDP64 sequence numbers never captured) in {} ms",
                u(f, "messages"), u(f, "packets"), u(f, "missed_messages"), u(f, "confirmed_ms"));
        }
        println!(
            "== all market data read by the algo, all orders answered ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        let (algo, oms) = run.shut_down()?;
        println!(
            "== stopped cleanly ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        report::audit_run(
            &run,
            feed.as_ref(),
            itch_feed.as_ref(),
            &algo,
            &oms,
            &floor,
            started,
        )
    })();
    drop(run);
    let failed = !matches!(result, Ok(true));
    if failed {
        if let Some(t) = temp.take() {
            let _ = t.keep();
            println!(
                "work dir kept for inspection (logs in {}/logs)",
                work.display()
            );
        }
    }
    drop(temp);
    match result {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            let out = json!({"demo": "failed", "error": format!("{e:#}"), "work_dir": work.display().to_string()});
            eprintln!("demo failed: {e:#}");
            println!("{out}");
            std::process::exit(1)
        }
    }
}
