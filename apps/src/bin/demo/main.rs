//! `demo`: seqstream's main job, end to end on one machine (see `scripts/demo.sh`).
//!
//! It starts, on three simulated hosts (network namespaces as root, loopback addresses
//! otherwise), one `seqstreamd` each, from the host files the topology module writes (the
//! same topology as `config/`), and the applications:
//!
//! ```text
//!  seq host : seqstreamd: sequencer md (stream 1), sequencer orders (stream 2), compositor
//!             (stream 3 = 1 + 2), a replication server per stream; netfloor serve
//!  host 1   : seqstreamd: replicas of 2 and 3, forwarder (routes 2); algo
//!  host 2   : seqstreamd: replicas of 1 and 2, forwarder (routes 1 and 2); oms, feedhandler
//! ```
//!
//! `--threading shared` (the default) runs each seqstreamd's roles on one thread,
//! `dedicated` gives each role and each replica's sender a thread of its own.
//!
//! With `--feeds itch` or `--feeds both` a second market-data stream joins: Nasdaq ITCH 5.0
//! (stream 4, `streams::ITCH`) from a second feed handler on host 2 (`feedhandler --feed
//! itch`, source 4), with its own sequencer and replication server on the seq host, a route
//! and a replica on host 2, and the compositor merges it too (stream 3 = 1 + 2 + 4 for
//! `both`, 2 + 4 for `itch`, where stream 1 and the CME feed handler are not started). The
//! algo trades on CME books only and counts the ITCH messages; with `itch` it sends no
//! orders, and the audit expects none.
//!
//! It measures the network floor (netfloor), replays the captures through the feed handlers,
//! waits until the algo has seen all the market data and every order has its report, stops
//! the applications, waits until the composite holds every component message, stops the
//! sequencer host (whose replication senders drain: each sends what its store holds until
//! its replica has acknowledged all of it), waits until every replica has its primary's
//! final end, stops the application hosts, and then audits the
//! stores: each source's messages present exactly once, every order answered by exactly one
//! report, the composite holding each component message once, every store passing `storetool
//! verify`, every replica's digest equal to its primary's. The last line printed is one JSON
//! object; the exit status is 0 only if every check passed. `--write-config DIR` writes the
//! topology's host files for real hosts instead (the files of `config/`).
//!
//! | module | owns |
//! |---|---|
//! | `topology` | what runs where: each host's seqstreamd file (the same as `config/`) |
//! | `seqstream_apps::net` | the simulated hosts: network namespaces and veth links, or loopback addresses |
//! | `procs` | the child processes: logs, stop, kill on every way out |
//! | `report` | the audit of the stopped run and its JSON line |
//! | this file | the orchestration: start, measure the floor, replay, stop |

mod procs;
mod report;
mod topology;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use seqstream_apps::audit;
use seqstream_apps::streams::{COMPOSITE, ITCH, MARKET_DATA, ORDERS};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_store::digest::digest;
use serde_json::{json, Value};

use procs::Procs;
use seqstream_apps::net::{Host, Network, NetworkKind};
use topology::{Site, Threading, ITCH_SOURCE};

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
    /// First of the ports used (about 25 above it).
    #[arg(long, default_value_t = 47100)]
    port_base: u16,
    /// Segment size of every store, bytes (small segments exercise rolls).
    #[arg(long, default_value_t = 4 << 20)]
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
    /// Write the topology's host files for real hosts (10.0.0.1-3, /var/lib/seqstream,
    /// pinned, busy-spinning: the files of config/) into this directory, and exit.
    #[arg(long)]
    write_config: Option<PathBuf>,
    /// Give up (and fail) after this many seconds (default: 60 plus the replay's duration).
    #[arg(long)]
    timeout_s: Option<u64>,
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

fn store_exists(dir: &Path) -> Result<bool> {
    Ok(seqstream_store::layout::list(dir).is_ok_and(|l| !l.segments.is_empty()))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| s(path))?;
    serde_json::from_str(text.trim()).with_context(|| format!("{}: not JSON", path.display()))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

struct Run<'a> {
    cli: &'a Cli,
    l: Layout,
    net: Network,
    procs: Procs,
    stop: std::sync::Arc<AtomicBool>,
    deadline: Instant,
    /// Each host's seqstreamd threads once everything had started: (host, thread names).
    threads: Vec<(&'static str, Vec<String>)>,
}

impl Run<'_> {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The composite's components on the seq host (stream id, store), in merge order.
    fn components(&self) -> Vec<(u32, PathBuf)> {
        let f = self.cli.feeds;
        [
            (f.cme(), MARKET_DATA, "md"),
            (true, ORDERS, "orders"),
            (f.itch(), ITCH, "itch"),
        ]
        .into_iter()
        .filter(|(on, _, _)| *on)
        .map(|(_, id, dir)| (id, self.l.store("seq", dir)))
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
            || store_exists(dir),
        )
    }

    /// The topology laid on this run's simulated hosts and work directory.
    fn site(&self) -> Site {
        let (net, cli) = (&self.net, self.cli);
        Site {
            cme: cli.feeds.cme(),
            itch: cli.feeds.itch(),
            seq_bind: net.seq_bind(),
            seq_from: [net.seq_from_h1, net.seq_from_h2],
            host_ip: [net.h1.ip, net.h2.ip],
            client_ip: [net.client_ip(&net.h1), net.client_ip(&net.h2)],
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
            heartbeat_ms: Some(100),
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
        let seq = net.seq.clone();
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
        // Application hosts' outboxes first: the forwarders open them at start.
        for (h, host) in ["h1", "h2"].into_iter().enumerate() {
            for (name, source, stream) in site.outboxes_of(h) {
                let path = site.outbox(host, name);
                Outbox::open_or_create(&path, source, stream, 8 << 20, 4096)
                    .with_context(|| s(&path))?;
            }
        }
        // The sequencer host, then the application hosts once its stores exist (their
        // replication clients would otherwise be refused until then).
        self.start_host(&seq, &files[0].1)?;
        for stream in site.sequenced().into_iter().chain([COMPOSITE]) {
            self.wait_store(&site.store("seq", stream))?;
        }
        self.start_host(&h1, &files[1].1)?;
        self.start_host(&h2, &files[2].1)?;
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

    /// Records the threads of each host's seqstreamd (from `/proc/<pid>/task`).
    fn sample_threads(&mut self) -> Result<()> {
        for host in ["seq", "h1", "h2"] {
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

    /// netfloor: one UDP one-way h1 → seq plus one TCP one-way seq → h1, per round trip.
    fn floor(&mut self) -> Result<Value> {
        let (seq, h1) = (self.net.seq.clone(), self.net.h1.clone());
        let port = self.cli.port_base + 21;
        let serve = vec![
            "serve".into(),
            "--udp".into(),
            format!("{}:{port}", self.net.seq_bind()),
            "--tcp".into(),
            format!("{}:{port}", self.net.seq_bind()),
        ];
        self.spawn("netfloor-serve", &seq, "netfloor", serve)?;
        let target = self.net.seq_from_h1;
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
            names.push("feedhandler-itch");
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

    /// Stops everything so that every store ends complete: applications, then sequencers,
    /// then the compositor once it has merged all, then — once every replica equals its
    /// primary — the replication servers and iodaemons.
    fn shut_down(&mut self) -> Result<(Value, Value)> {
        self.procs.stop("algo")?;
        self.procs.stop("oms")?;
        // Nothing but heartbeat frames reaches a primary now; once the compositor has merged
        // every component message, the sequencer host stops: its replication senders drain
        // (they send what their stores hold until their replicas have acknowledged it all),
        // so every primary's end is final and held by its replicas.
        let composite = self.l.store("seq", "composite");
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
        self.procs.stop("seqstreamd-seq")?;
        let ends = self
            .replica_pairs()
            .into_iter()
            .map(|(primary, replica)| Ok((digest(&primary)?.end_position, replica)))
            .collect::<Result<Vec<_>>>()?;
        let left = self.left();
        wait_until(
            "every replica to catch up",
            left,
            &mut self.procs,
            &self.stop,
            || {
                Ok(ends
                    .iter()
                    .all(|(end, replica)| digest(replica).map_or(0, |d| d.end_position) == *end))
            },
        )?;
        for name in ["seqstreamd-h1", "seqstreamd-h2"] {
            self.procs.stop(name)?;
        }
        Ok((
            read_json(&self.l.file("h1", "algo.json"))?,
            read_json(&self.l.file("h2", "oms.json"))?,
        ))
    }

    fn replica_pairs(&self) -> Vec<(PathBuf, PathBuf)> {
        let f = self.cli.feeds;
        [
            (f.cme(), "md", "h2"),
            (true, "orders", "h1"),
            (true, "orders", "h2"),
            (true, "composite", "h1"),
            (f.itch(), "itch", "h2"),
        ]
        .into_iter()
        .filter(|(on, _, _)| *on)
        .map(|(_, stream, host)| (stream, host))
        .map(|(stream, host)| (self.l.store("seq", stream), self.l.store(host, stream)))
        .collect()
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
    for d in ["seq", "h1", "h2", "counters"] {
        std::fs::create_dir_all(work.join(d))?;
    }
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
    if cli.feeds.cme() {
        let (packets, _) =
            seqstream_apps::feed::read_mdp3(std::slice::from_ref(&cli.capture), cli.max_frames)
                .with_context(|| format!("reading {}", cli.capture.display()))?;
        span = span.max(span_s(
            packets.first().map(|p| p.sending_time_ns),
            packets.last().map(|p| p.sending_time_ns),
        ));
    }
    if cli.feeds.itch() {
        let files = seqstream_apps::feed::capture_files(std::slice::from_ref(&cli.itch_capture))?;
        let (packets, _, _) = seqstream_apps::feed::read_itch(&files, None)
            .with_context(|| format!("reading {}", cli.itch_capture.display()))?;
        span = span.max(span_s(
            packets.first().map(|p| p.timestamp_ns),
            packets.last().map(|p| p.timestamp_ns),
        ));
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
        println!("== started ({} feeds, {} threading): 3 seqstreamd ({streams} sequencers, compositor, {} replication servers; 2 hosts' replicas and forwarders), algo, oms ({:.1} s)", cli.feeds.name(), cli.threading.name(), streams + 1, started.elapsed().as_secs_f64());
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
