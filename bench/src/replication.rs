//! `bench replication`: append on the primary → visible to a tailer of a replica, and
//! streaming throughput, with 1, 2 and 4 followers, next to floors measured in the same run
//! over the same loopback path: a raw TCP one-way hop (same one-in-flight method) and raw TCP
//! bandwidth (one stream). Also the fast follower's latency beside a deliberately slow one,
//! and one follower's over TLS (`append_to_replica_64B_1f_tls`, certificates made for the
//! run), against the same floor.
//!
//! Threads: the appender, the replica's tailer, the server's sender threads and the followers
//! all wait as `--idle` says (default `yield`: `sched_yield`), and so do both ends of the TCP
//! floor (they spin under `busy-spin`): with more busy threads than the 2 cores here, a spinning waiter would starve the
//! thread it waits for until its time slice ends. The ratios say how far the replication path
//! is from a bare TCP hop on the same machine, not what pinned busy-spinning threads on
//! isolated cores would give (run with `--idle busy-spin` on a machine with enough cores).
//! `append_to_replica_64B_1f_invoker` has the floor's two threads: the appending thread runs
//! the server's duty cycle, the reading thread the follower's (each end embedded in its
//! application, `threading = "invoker"`).

use bench::certs::LoopbackTls;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use seqstream_agent::clock::Clock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_agent::{AgentInvoker, AgentRunner, CompositeAgent, Idle, RunnerConfig};
use seqstream_auth::{Key, Keyring};
use seqstream_replication::follower::{AckTiming, Follower, FollowerConfig};
use seqstream_replication::server::{Server, ServerConfig};
use seqstream_store::{Appender, StoreConfig, Tailer, TailerOptions};

use crate::oneway::{append_to_tailer, next_stamp, ping, tcp_one_way, Pinning};
use crate::report::{emit_percentiles, Better, Figure, Reporter};

/// Options of the replication benchmark.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Follower counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    followers: Vec<usize>,
    /// Latency samples per case (after 10 % warm-up).
    #[arg(long, default_value_t = 20_000)]
    samples: u64,
    /// Bytes of 64-byte-payload frames streamed per throughput case (appended as fast as
    /// possible; timed until every replica holds them).
    #[arg(long, default_value_t = 128 << 20)]
    bytes: u64,
    /// Idle strategy of the server's senders and the followers.
    #[arg(long, default_value = "yield")]
    idle: Idle,
    /// Directory for the stores (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A short run for smoke tests: 1 and 2 followers, 8 MiB, 2,000 samples.
    #[arg(long)]
    quick: bool,
}

const BENCH: &str = "replication";
const STREAM: u32 = 1;
/// The replication key of the bench's server and followers.
fn keys() -> Keyring {
    Keyring::fixed(Key::from_material(b"the replication bench's key"))
}
/// Threads started for a case; stopped and joined on drop.
struct Running {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Topology {
    primary: PathBuf,
    replicas: Vec<PathBuf>,
    counters: Vec<PathBuf>,
    addr: SocketAddr,
    running: Running,
}

/// The segment size of a full run's stores: the default `--bytes`, written twice (streamed,
/// then caught up), fills one.
const SEGMENT: u64 = 256 << 20;

/// Where and how every case sets up its topology.
struct Setup<'a> {
    /// The scratch dir that holds every case's stores and counters.
    dir: &'a Path,
    /// The idle strategy of the server's senders and of the followers.
    idle: &'a Idle,
    /// The segment size of every store, in bytes.
    segment: u64,
}

impl Setup<'_> {
    fn store_cfg(&self) -> StoreConfig {
        StoreConfig::new(STREAM).segment_size(self.segment)
    }

    /// Removes the files of the case called `name`: every path under `dir` named
    /// `{name}-…`, as [`topology`] names them.
    fn remove(&self, name: &str) -> Result<()> {
        let prefix = format!("{name}-");
        for r in self.dir.read_dir()? {
            let p = r?.path();
            if p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&prefix))
            {
                if p.is_dir() {
                    std::fs::remove_dir_all(&p)?;
                } else {
                    std::fs::remove_file(&p)?;
                }
            }
        }
        Ok(())
    }
}

/// A server on `primary` and `followers` followers, each in its own thread; over TLS when
/// `tls` is given.
fn topology(
    setup: &Setup,
    name: &str,
    followers: usize,
    tls: Option<&LoopbackTls>,
) -> Result<Topology> {
    let (dir, idle) = (setup.dir, setup.idle);
    let primary = dir.join(format!("{name}-primary"));
    if !primary.exists() {
        drop(Appender::open_or_create(&primary, setup.store_cfg())?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut cfg = ServerConfig::new(primary.clone(), STREAM, "127.0.0.1:0".parse()?, keys());
    cfg.idle = idle.clone();
    cfg.max_consumers = followers + 1;
    cfg.tls = tls.map(|t| t.server.clone());
    let w = CountersWriter::create(&dir.join(format!("{name}-server.counters")), 256)?;
    let server = Server::bind(cfg, &w)?;
    let addr = server.local_addr();
    let acceptor = AgentRunner::start(
        server,
        RunnerConfig {
            idle: Idle::Sleep(Duration::from_millis(1)),
            ..RunnerConfig::default()
        },
        stop.clone(),
    )?;
    threads.push(std::thread::spawn(move || {
        acceptor.join().expect("replication server");
    }));
    let mut replicas = Vec::new();
    let mut counter_files = Vec::new();
    for i in 0..followers {
        let replica = dir.join(format!("{name}-replica-{i}"));
        let cpath = dir.join(format!("{name}-follower-{i}.counters"));
        let mut fcfg = FollowerConfig::new(replica.clone(), STREAM, addr, keys());
        fcfg.store_config = setup.store_cfg();
        fcfg.tls = tls.map(|t| {
            (
                t.client.clone(),
                rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            )
        });
        let w = CountersWriter::create(&cpath, 64)?;
        let f = Follower::new(fcfg, &w)?;
        let runner = AgentRunner::start(
            f,
            RunnerConfig {
                idle: idle.clone(),
                ..RunnerConfig::default()
            },
            stop.clone(),
        )?;
        threads.push(std::thread::spawn(move || {
            runner.join().expect("follower");
        }));
        replicas.push(replica);
        counter_files.push(cpath);
    }
    Ok(Topology {
        primary,
        replicas,
        counters: counter_files,
        addr,
        running: Running { stop, threads },
    })
}

fn replica_position(counters_file: &Path) -> u64 {
    counters::read(counters_file)
        .ok()
        .and_then(|s| s.get("replica position"))
        .unwrap_or(0)
}

fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let end = Instant::now() + deadline;
    while !done() {
        ensure!(
            Instant::now() < end,
            "replicas did not catch up in {deadline:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    let (followers, samples, bytes, segment) = if args.quick {
        (vec![1, 2], 2_000, 8 << 20, crate::QUICK_SEGMENT)
    } else {
        (args.followers.clone(), args.samples, args.bytes, SEGMENT)
    };
    // The appender, the replica's tailer, and a sender and a follower per follower.
    let most = followers.iter().max().copied().unwrap_or(1);
    crate::oneway::warn_if_spinners_outnumber_cores("replication", &args.idle, 2 + 2 * most);
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("seqstream-bench-repl-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a scratch dir in {}", base.display()))?;
    let dir = scratch.path();
    let setup = Setup {
        dir,
        idle: &args.idle,
        segment,
    };

    let tcp_floor = tcp_one_way(samples, Pinning::waiting(&args.idle))?;
    let bw_floor = tcp_bandwidth(bytes)?;
    for &n in &followers {
        latency(&setup, n, samples, &tcp_floor, reporter, Case::Plain)?;
        throughput(&setup, n, bytes, bw_floor, reporter)?;
    }
    latency_invoker(&setup, samples, &tcp_floor, reporter)?;
    latency(&setup, 1, samples, &tcp_floor, reporter, Case::SlowPeer)?;
    let tls = bench::certs::loopback_tls(dir)?;
    latency(&setup, 1, samples, &tcp_floor, reporter, Case::Tls(&tls))?;
    Ok(())
}

/// Raw TCP bandwidth over loopback, one stream, 256 KiB writes: bytes/s.
fn tcp_bandwidth(bytes: u64) -> Result<f64> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut tx = TcpStream::connect(l.local_addr()?)?;
    let (mut rx, _) = l.accept()?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match rx.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let chunk = vec![7u8; 256 << 10];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        tx.write_all(&chunk)?;
        sent += chunk.len() as u64;
    }
    drop(tx);
    let got = reader.join().expect("reader thread")?;
    ensure!(got == sent, "raw TCP lost bytes");
    Ok(sent as f64 / t0.elapsed().as_secs_f64())
}

/// A replica that reads slowly: its handshake, then 4 KiB every millisecond.
fn slow_peer(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok(s) = TcpStream::connect(addr) else {
            return;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut peer = seqstream_replication::peer::Peer::new(s);
        if peer.handshake_as_replica(STREAM, 0, &keys()).is_err() {
            return;
        }
        let mut s = peer.stream;
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = [0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            let _ = s.read(&mut buf);
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// What a latency case measures besides its followers.
#[derive(Clone, Copy)]
enum Case<'a> {
    /// Plain TCP.
    Plain,
    /// Beside a replica that reads slowly.
    SlowPeer,
    /// Over TLS.
    Tls(&'a LoopbackTls),
}

fn latency(
    setup: &Setup,
    n: usize,
    samples: u64,
    floor: &hdrhistogram::Histogram<u64>,
    reporter: &Reporter,
    case: Case<'_>,
) -> Result<()> {
    let (name, figure, tls) = match case {
        Case::Plain => (
            format!("lat-{n}"),
            format!("append_to_replica_64B_{n}f"),
            None,
        ),
        Case::SlowPeer => (
            "lat-slow".to_string(),
            "append_to_replica_64B_beside_slow_peer".to_string(),
            None,
        ),
        Case::Tls(t) => (
            format!("lat-tls-{n}"),
            format!("append_to_replica_64B_{n}f_tls"),
            Some(t),
        ),
    };
    let topo = topology(setup, &name, n, tls)?;
    let slow =
        matches!(case, Case::SlowPeer).then(|| slow_peer(topo.addr, topo.running.stop.clone()));
    let mut appender = Appender::open(&topo.primary, setup.store_cfg())?;
    appender.append(&[0u8; 64])?; // creates every replica
    let target = appender.position();
    wait_until(Duration::from_secs(30), || {
        topo.counters.iter().all(|c| replica_position(c) == target)
    })?;
    let mut tailer = Tailer::open_with(&topo.replicas[0], TailerOptions::default())?;
    tailer.seek_position(target)?;
    let h = append_to_tailer(samples, Pinning::waiting(setup.idle), appender, tailer)?;
    emit_percentiles(reporter, BENCH, &figure, &h, floor)?;
    drop(topo);
    if let Some(t) = slow {
        let _ = t.join();
    }
    setup.remove(&name)
}

/// `append_to_replica_64B_1f_invoker`: [`latency`]'s one follower with no thread of the
/// path's own. The appending thread runs the server's duty cycle (its acceptor, and the
/// sender it hands out) after each append: a primary whose host is embedded in the
/// application that writes it (`threading = "invoker"`). The reading thread runs the
/// follower's before each poll of the replica, acknowledging at its next cycle (`ack =
/// "next-cycle"`, as such a host's `[[follow]]` table should say). So the path has the floor's
/// two threads, one at each end of the TCP connection.
fn latency_invoker(
    setup: &Setup,
    samples: u64,
    floor: &hdrhistogram::Histogram<u64>,
    reporter: &Reporter,
) -> Result<()> {
    let name = "lat-invoker";
    let dir = setup.dir;
    let primary = dir.join(format!("{name}-primary"));
    let replica = dir.join(format!("{name}-replica-0"));
    let mut appender = Appender::open_or_create(&primary, setup.store_cfg())?;
    let mut host = CompositeAgent::new(Some("primary".to_string()), Vec::new());
    let mut cfg = ServerConfig::new(primary.clone(), STREAM, "127.0.0.1:0".parse()?, keys());
    cfg.sender_host = Some(host.sink());
    let w = CountersWriter::create(&dir.join(format!("{name}-server.counters")), 256)?;
    let server = Server::bind(cfg, &w)?;
    let mut fcfg = FollowerConfig::new(replica.clone(), STREAM, server.local_addr(), keys());
    fcfg.store_config = setup.store_cfg();
    fcfg.ack = AckTiming::NextCycle;
    let w = CountersWriter::create(&dir.join(format!("{name}-follower-0.counters")), 64)?;
    let follower = Follower::new(fcfg, &w)?;
    let mut upstream =
        AgentInvoker::new(host.with_members([Box::new(server) as _]), Clock::system());
    let mut downstream = AgentInvoker::new(follower, Clock::system());
    appender.append(&[0u8; 64])?; // creates the replica
    let target = appender.position();
    let deadline = Instant::now() + Duration::from_secs(30);
    let both = |up: &mut AgentInvoker<CompositeAgent>, down: &mut AgentInvoker<Follower>| {
        up.invoke()
            .and_then(|_| down.invoke())
            .map_err(|e| anyhow::anyhow!("replicating the first frame: {e}"))
    };
    let mut tailer = loop {
        both(&mut upstream, &mut downstream)?;
        if let Ok(t) = Tailer::open_with(&replica, TailerOptions::default()) {
            break t;
        }
        ensure!(Instant::now() < deadline, "no replica after 30 s");
        std::thread::yield_now();
    };
    while tailer.position() < target {
        ensure!(
            Instant::now() < deadline,
            "the first frame was not replicated"
        );
        both(&mut upstream, &mut downstream)?;
        tailer.poll()?;
    }
    let mut payload = [0u8; 64];
    let h = ping(
        samples,
        Pinning::waiting(setup.idle),
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            appender.append(&payload).expect("append");
            upstream.invoke().expect("the primary's server");
        },
        move || {
            downstream.invoke().expect("the follower");
            next_stamp(&mut tailer)
        },
    )?;
    emit_percentiles(
        reporter,
        BENCH,
        "append_to_replica_64B_1f_invoker",
        &h,
        floor,
    )?;
    setup.remove(name)
}

fn throughput(
    setup: &Setup,
    n: usize,
    bytes: u64,
    floor_bytes_per_s: f64,
    reporter: &Reporter,
) -> Result<()> {
    let name = format!("tput-{n}");
    // Set up first (replica stores created, segments preallocated), then time the stream:
    // from the first append of `bytes` until every replica holds the last byte.
    let topo = topology(setup, &name, n, None)?;
    let mut a = Appender::open(&topo.primary, setup.store_cfg())?;
    a.append(&[1u8; 64])?;
    let start = a.position();
    wait_until(Duration::from_secs(60), || {
        topo.counters.iter().all(|c| replica_position(c) == start)
    })?;
    let payload = [3u8; 64];
    let frames = bytes / seqstream_store::format::frame_span(64) as u64;
    let t0 = Instant::now();
    for _ in 0..frames {
        a.append(&payload)?;
    }
    let end = a.position();
    wait_until(Duration::from_secs(300), || {
        topo.counters.iter().all(|c| replica_position(c) == end)
    })?;
    let stream_secs = t0.elapsed().as_secs_f64();
    drop(topo);
    let streamed = end - start;
    // Catch-up: the followers stopped; the primary grows by `bytes` more; the followers come
    // back and read it from the store (page cache) in large batches.
    for _ in 0..frames {
        a.append(&payload)?;
    }
    let end2 = a.position();
    drop(a);
    let topo = topology(setup, &name, n, None)?;
    let t0 = Instant::now();
    wait_until(Duration::from_secs(300), || {
        topo.counters.iter().all(|c| replica_position(c) == end2)
    })?;
    let catch_up_secs = t0.elapsed().as_secs_f64();
    drop(topo);
    let span = seqstream_store::format::frame_span(64) as f64;
    for (case, secs, bytes) in [
        (format!("stream_64B_{n}f"), stream_secs, streamed),
        (format!("catch_up_64B_{n}f"), catch_up_secs, end2 - end),
    ] {
        // Per follower: each receives the whole stream.
        reporter.emit(&Figure::new(
            BENCH,
            &case,
            "throughput",
            "GB/s",
            bytes as f64 / secs / 1e9,
            floor_bytes_per_s / 1e9,
            Better::Higher,
        ));
        reporter.emit(&Figure::new(
            BENCH,
            &case,
            "throughput",
            "msgs/s",
            bytes as f64 / span / secs,
            floor_bytes_per_s / span,
            Better::Higher,
        ));
    }
    setup.remove(&name)
}
