//! `bench e2e`: the whole path as one figure, on `seqstreamd`'s runtime. An application on
//! host A `offer()`s a 64-byte message → A's forwarder → UDP → the sequencer → its store →
//! the replication server's sender → TCP → A's replication client → A's replica → a tailer on
//! A sees it (`offer_to_own_replica_64B`). In `pingpong_64B`, host B's application sees the
//! ping in B's replica and offers a pong, and A's tailer sees the pong: the stream's round
//! trip twice, the figure to set beside Aeron's ping-pong round trip.
//!
//! Three hosts run in this process, each one [`seqstreamd::Host`] started from the TOML a
//! user would write: the sequencer host (`[[sequencer]]`, `[[serve]]`) and hosts A and B
//! (`[[forward]]`, `[[follow]]`); the group cases run the second sequencer host instead of B. As root they are network namespaces on one bridge
//! (`seqstream_apps::net`, the demo's hosts): each host is started from a thread that entered
//! its namespace, so its sockets and runner threads live there. Otherwise (or with
//! `--network loopback`) they are loopback addresses.
//!
//! The floors are measured in the same run over the same links: a UDP datagram from host A to
//! a relay thread on the sequencer host, which writes it to a TCP connection read on A (raw
//! UDP one-way plus raw TCP one-way, with the sequencer host's thread hop); for the ping-pong,
//! A → relay → B and back through the same relay.
//!
//! Threading: `--layout` lays each host's roles on threads (`shared`: one thread per host;
//! `dedicated`: one per agent; `split`: the sequencer and its senders on one hot thread, the
//! server's acceptor on a sleeping one, hosts A and B shared; `invoker`: the sequencer host
//! shared, hosts A and B embedded in their applications under `threading = "invoker"`, their
//! roles run by the application thread that polls the replica, between its polls, and their
//! replication clients acknowledging a cycle late, `ack = "next-cycle"`; `--ack` sets another
//! timing for hosts A and B under every layout). By default every
//! layout runs a short survey and the fastest one by p50 runs every case. Every thread waits
//! with `--idle` (default `yield`): with more busy threads than the 2 cores here, a spinning
//! thread starves the one it waits for until its time slice ends. On a machine with a core
//! per thread, run with `--idle busy-spin`.
//!
//! Where the time goes: the plain case is also split at the frame's timestamp (the
//! sequencer's clock when it appended it) into `_offer_to_sequenced` (forwarder, UDP,
//! sequencer) against a raw UDP one-way hop, and `_sequenced_to_replica` (store, sender, TCP,
//! replication client, replica, tailer) against a raw TCP one-way hop.
//!
//! One thread (`offer_to_own_replica_64B_one_thread` and `pingpong_64B_one_thread`, under the
//! invoker layout whatever the survey chose): host A's application offers, then runs A's roles
//! (`threading = "invoker"`) and polls A's replica until the message (or B's pong) is there,
//! the shape of Aeron's ping. Their floors have the same shape: one thread of A sends the UDP
//! datagram to the relay and reads the relay's TCP connection.
//!
//! Variants in the same run, against the same floor: `_authenticated` (every source signs its
//! datagrams, `source_key`) and `_tls` (that, and the replication links over TLS). The
//! replication links always authenticate (handshake and session tags).
//!
//! Sequencer groups (`_group_immediate`, `_group_standby_ack`): the sequencer host runs
//! member 1 of a two-member `[[sequencer_group]]` (leading, with `bootstrap`) and the second
//! sequencer host member 2, its standby, over an etcd on the coordination host; host A's files are the
//! same, pointed at member 1; every host on one shared thread. Under `standby-ack` a frame
//! reaches A only after the standby acked it: `standby_ack_cost_64B` is the difference of
//! the two p50s (0 when noise puts the standby-ack p50 below the immediate one), against two
//! raw TCP one-way hops between the two sequencer hosts (the standby's round trip).

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use hdrhistogram::Histogram;
use seqstream_agent::clock::wall_clock_ns;
use seqstream_agent::{AgentInvoker, CompositeAgent, Idle};
use seqstream_apps::net::{Host as NetHost, Network, NetworkKind};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_replication::follower::AckTiming;
use seqstream_store::{Tailer, TailerOptions};
use seqstreamd::{Host, HostFile};

use crate::inbound::offer_until_accepted;
use crate::oneway::{
    histogram, ping_either, tcp_one_way_over, udp_one_way_over, Pinning, StampReader,
};
use crate::report::{emit_percentiles, Better, Figure, Reporter};

/// Options of the end-to-end benchmark.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Latency samples per case (after 10 % warm-up); the layout survey takes a quarter.
    #[arg(long, default_value_t = 20_000)]
    samples: u64,
    /// The thread layout of every host; `all` surveys them and runs the cases on the fastest.
    #[arg(long, value_enum, default_value = "all")]
    layout: LayoutChoice,
    /// The hosts: network namespaces on one bridge (`auto` as root, when `ip netns`
    /// works), or loopback addresses.
    #[arg(long, value_enum, default_value = "auto")]
    network: NetworkKind,
    /// Idle strategy of every host thread; with `busy-spin`, the application threads spin too.
    #[arg(long, default_value = "yield")]
    idle: Idle,
    /// When hosts A and B's replication clients acknowledge: immediate, next-cycle or
    /// delayed:<N>us (default: next-cycle under the invoker layout, immediate otherwise).
    #[arg(long)]
    ack: Option<AckTiming>,
    /// A short run for smoke tests: 1,000 samples.
    #[arg(long)]
    quick: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LayoutChoice {
    All,
    Shared,
    Dedicated,
    Split,
    Invoker,
}

/// How each host lays its roles on threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layout {
    /// `threading = "shared"` on every host: one thread each.
    Shared,
    /// `threading = "dedicated"`: a thread per agent (the server's acceptor sleeps).
    Dedicated,
    /// The sequencer host in groups (sequencer and senders on one thread, the acceptor on a
    /// sleeping one); hosts A and B shared.
    Split,
    /// The sequencer host shared; hosts A and B under `threading = "invoker"`, their roles
    /// run by the application's polling thread.
    Invoker,
}

impl Layout {
    const ALL: [Layout; 4] = [
        Layout::Shared,
        Layout::Dedicated,
        Layout::Split,
        Layout::Invoker,
    ];

    fn name(self) -> &'static str {
        match self {
            Layout::Shared => "shared",
            Layout::Dedicated => "dedicated",
            Layout::Split => "split",
            Layout::Invoker => "invoker",
        }
    }
}

/// What secures the path, beyond the replication handshake and session tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// Sources trusted by address; replication over plain TCP.
    Plain,
    /// Every source signs its datagrams.
    SourceKeys,
    /// Signed datagrams, and replication over TLS.
    Tls,
}

impl Security {
    fn suffix(self) -> &'static str {
        match self {
            Security::Plain => "",
            Security::SourceKeys => "_authenticated",
            Security::Tls => "_tls",
        }
    }
}

const BENCH: &str = "e2e";
const STREAM: u32 = 1;
/// A tag in byte 8 of every payload (bytes 0..8 are the stamp).
const PING: u8 = 1;
const PONG: u8 = 2;
const WARM_UP: u8 = 3;
/// The stream's segment size: big enough for every case, small enough to pretouch quickly
/// (the sequencer and each replica pretouch a new segment). `--quick` runs take
/// [`crate::QUICK_SEGMENT`].
const SEGMENT: u64 = 64 << 20;

/// Where a run's cases put their files, the segment size of their stores, and when hosts A
/// and B acknowledge (`--ack`; `None`: as their layout says).
struct Scratch<'a> {
    dir: &'a Path,
    segment: u64,
    ack: Option<AckTiming>,
}
/// How long a host may take to start and pass its first message.
const STARTUP: Duration = Duration::from_secs(30);

/// An application host: where it is, its source id, outbox and replica.
struct AppHost {
    name: &'static str,
    /// Its network host (namespace or loopback address).
    net: NetHost,
    /// The address its replication client connects from, as the sequencer host sees it.
    client_ip: IpAddr,
    source: u32,
    outbox: PathBuf,
    replica: PathBuf,
}

impl AppHost {
    /// Its application's outbox, created if it is not there yet.
    fn open_outbox(&self) -> Result<Outbox> {
        Ok(Outbox::open_or_create(
            &self.outbox,
            self.source,
            STREAM,
            16 << 20,
            1 << 20,
        )?)
    }
}

/// The files and ports every host of one case names.
struct Site {
    dir: PathBuf,
    /// The sequencer host (its sockets bind its address, which every host reaches).
    seq: NetHost,
    /// The sequencer's UDP port and the replication server's TCP port.
    sequencer_port: u16,
    server_port: u16,
    secret: PathBuf,
    hosts: [AppHost; 2],
    certs: Option<bench::certs::Certs>,
    security: Security,
    /// The segment size of every store.
    segment: u64,
    /// When hosts A and B acknowledge what they replicated; `None`: as their layout says.
    ack: Option<AckTiming>,
}

impl Drop for Site {
    /// A case's files go with it, so that a run holds one case's stores at a time. Its hosts,
    /// started after it, have stopped by then.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free port on `ip` (bound then released; nothing else in the host should take it in
/// the moment before a role binds it).
fn free_port(ip: IpAddr, udp: bool) -> Result<u16> {
    Ok(if udp {
        UdpSocket::bind((ip, 0))?.local_addr()?.port()
    } else {
        TcpListener::bind((ip, 0))?.local_addr()?.port()
    })
}

impl Site {
    fn new(root: &Scratch, name: &str, net: &Network, security: Security) -> Result<Site> {
        let dir = root.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let secret = dir.join("replication.key");
        bench::certs::write_private(&secret, b"the e2e bench's replication key")?;
        let host = |name: &'static str, h: &NetHost, source: u32| AppHost {
            name,
            net: h.clone(),
            client_ip: net.client_ip(h),
            source,
            outbox: dir.join(format!("{name}.outbox")),
            replica: dir.join(format!("{name}-replica")),
        };
        let hosts = [host("a", &net.h1, 1), host("b", &net.h2, 2)];
        for h in &hosts {
            if security != Security::Plain {
                bench::certs::write_private(
                    &dir.join(format!("source-{}.key", h.source)),
                    format!("the e2e bench's key of source {}", h.source).as_bytes(),
                )?;
            }
            // Before its forwarder starts, which opens it.
            drop(h.open_outbox()?);
        }
        let certs = match security {
            Security::Tls => Some(bench::certs::write(&dir, &[net.seq.ip.to_string()])?),
            _ => None,
        };
        let ip = net.seq.ip;
        Ok(Site {
            sequencer_port: net.seq.enter(|| free_port(ip, true))??,
            server_port: net.seq.enter(|| free_port(ip, false))??,
            seq: net.seq.clone(),
            secret,
            hosts,
            certs,
            security,
            segment: root.segment,
            ack: root.ack,
            dir,
        })
    }

    fn source_key(&self, source: u32) -> Option<String> {
        (self.security != Security::Plain).then(|| {
            format!(
                "\"{source}={}\"",
                self.dir.join(format!("source-{source}.key")).display()
            )
        })
    }

    /// The sequencer host's file: the sequencer and the server of its store.
    fn sequencer_host(&self, layout: Layout, idle: &Idle) -> String {
        let store = self.dir.join("stream");
        let sources: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("\"{}@{}\"", h.source, h.net.ip))
            .collect();
        let mut allow: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("\"{}\"", h.client_ip))
            .collect();
        allow.dedup();
        let keys: Vec<String> = self
            .hosts
            .iter()
            .filter_map(|h| self.source_key(h.source))
            .collect();
        let mut t = threading(layout, idle, true);
        t += &format!(
            "[[sequencer]]\nname = \"seq\"\nstore = \"{}\"\nstream_id = {STREAM}\nsegment_size = {}\nlisten = \"{}\"\nsource = [{}]\n",
            store.display(),
            self.segment,
            SocketAddr::new(self.seq.ip, self.sequencer_port),
            sources.join(", ")
        );
        if !keys.is_empty() {
            t += &format!("source_key = [{}]\n", keys.join(", "));
        }
        t += &role_idle(layout, idle);
        t += &format!(
            "[[serve]]\nname = \"serve\"\nstore = \"{}\"\nstream_id = {STREAM}\nsecret_file = \"{}\"\nlisten = \"{}\"\nallow = [{}]\n",
            store.display(),
            self.secret.display(),
            SocketAddr::new(self.seq.ip, self.server_port),
            allow.join(", ")
        );
        if let Some(c) = &self.certs {
            t += &format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                c.cert.display(),
                c.key.display()
            );
        }
        // Under split threading the senders' thread is the hot group's, not their own.
        if layout != Layout::Split {
            t += &role_idle(layout, idle);
        }
        t
    }

    /// Host `h`'s file: the replica of the stream (from the replication server at `upstream`)
    /// and the forwarder of its outbox.
    fn app_host(&self, h: &AppHost, upstream: SocketAddr, layout: Layout, idle: &Idle) -> String {
        let app_layout = if layout == Layout::Split {
            Layout::Shared
        } else {
            layout
        };
        let mut t = threading(app_layout, idle, false);
        t += &format!(
            "[[follow]]\nname = \"rep\"\nupstream = \"{upstream}\"\nstore = \"{}\"\nstream_id = {STREAM}\nsecret_file = \"{}\"\n",
            h.replica.display(),
            self.secret.display()
        );
        // Under invoker the application reads the replica between cycles: before a
        // next-cycle acknowledgement.
        let ack = self.ack.unwrap_or(if app_layout == Layout::Invoker {
            AckTiming::NextCycle
        } else {
            AckTiming::Immediate
        });
        t += &format!("ack = \"{ack}\"\n");
        if let Some(c) = &self.certs {
            t += &format!("tls_ca = \"{}\"\n", c.ca.display());
        }
        t += &role_idle(app_layout, idle);
        t += &format!(
            "[[forward]]\nname = \"fwd\"\noutbox = [\"{}\"]\nroute = [\"{STREAM}={}={}\"]\nbind = \"{}:0\"\n",
            h.outbox.display(),
            SocketAddr::new(self.seq.ip, self.sequencer_port),
            h.replica.display(),
            h.net.ip
        );
        if let Some(k) = self.source_key(h.source) {
            t += &format!("source_key = [{k}]\n");
        }
        t += &role_idle(app_layout, idle);
        t
    }

    /// Starts the sequencer host and the first `app_hosts` application hosts.
    fn start(&self, layout: Layout, idle: &Idle, app_hosts: usize) -> Result<Hosts> {
        let mut files = vec![("seq", &self.seq, self.sequencer_host(layout, idle))];
        for h in &self.hosts[..app_hosts] {
            let upstream = SocketAddr::new(self.seq.ip, self.server_port);
            files.push((h.name, &h.net, self.app_host(h, upstream, layout, idle)));
        }
        self.start_files(files)
    }
}

/// The release policy of a sequencer group case: `immediate` or `standby-ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    Immediate,
    StandbyAck,
}

impl Release {
    fn name(self) -> &'static str {
        match self {
            Release::Immediate => "immediate",
            Release::StandbyAck => "standby-ack",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Release::Immediate => "_group_immediate",
            Release::StandbyAck => "_group_standby_ack",
        }
    }
}

impl Site {
    /// The `[[sequencer_group]]` member `node` (1 on the sequencer host, leading; 2 on the
    /// second sequencer host, its standby) of a two-member group under `release`, on one
    /// shared thread.
    fn member_host(
        &self,
        node: u32,
        listen: SocketAddr,
        members: &str,
        etcd: &str,
        release: Release,
        idle: &Idle,
    ) -> String {
        let a = &self.hosts[0];
        let sources: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("\"{}@{}\"", h.source, h.net.ip))
            .collect();
        let mut t = threading(Layout::Shared, idle, true);
        t += &format!(
            "[[sequencer_group]]\nname = \"seq\"\nstore = \"{}\"\nstream_id = {STREAM}\nsegment_size = {}\nlisten = \"{listen}\"\nsource = [{}]\nnode_id = {node}\nmember = [{members}]\netcd = [\"{etcd}\"]\netcd_prefix = \"/seqstream/bench-e2e\"\nlease_ttl_s = 2\nrelease = \"{}\"\nbootstrap = {}\nsecret_file = \"{}\"\n",
            self.dir.join(format!("member-{node}")).display(),
            self.segment,
            sources.join(", "),
            release.name(),
            node == 1,
            self.secret.display(),
        );
        if node == 1 {
            // The consumer: host A's replication client (the standby is no consumer).
            t += &format!("allow = [\"{}\"]\n", a.client_ip);
        }
        t
    }

    /// Starts etcd (on the coordination host) and a two-member sequencer group under
    /// `release` (member 1 on the sequencer host at the addresses host A uses, so A's files
    /// are those of the single sequencer; member 2, the standby, on the second sequencer
    /// host), then host A; returns once they are started.
    fn start_group(
        &self,
        net: &Network,
        release: Release,
        idle: &Idle,
    ) -> Result<(seqstream_testkit::etcd::Etcd, Hosts)> {
        let a = &self.hosts[0];
        let etcd = net
            .coord
            .enter(|| seqstream_testkit::etcd::Etcd::start_on(&[net.coord.ip]))?;
        let standby = &net.seq2;
        let standby_port = standby.enter(|| free_port(standby.ip, false))??;
        let standby_udp = standby.enter(|| free_port(standby.ip, true))??;
        let leader_replication = SocketAddr::new(net.seq.ip, self.server_port);
        let members = format!(
            "\"1={leader_replication}\", \"2={}\"",
            SocketAddr::new(standby.ip, standby_port)
        );
        let leader = self.member_host(
            1,
            SocketAddr::new(net.seq.ip, self.sequencer_port),
            &members,
            &etcd.endpoint(),
            release,
            idle,
        );
        let standby_file = self.member_host(
            2,
            SocketAddr::new(standby.ip, standby_udp),
            &members,
            &etcd.endpoint(),
            release,
            idle,
        );
        let files = [
            ("member-1", &self.seq, leader),
            ("member-2", standby, standby_file),
            (
                a.name,
                &a.net,
                self.app_host(a, leader_replication, Layout::Shared, idle),
            ),
        ];
        let hosts = self.start_files(files)?;
        Ok((etcd, hosts))
    }

    /// Starts one in-process host per `(name, network host, file)`, in order.
    fn start_files<'n>(
        &self,
        files: impl IntoIterator<Item = (&'static str, &'n NetHost, String)>,
    ) -> Result<Hosts> {
        let mut hosts = Hosts(Vec::new());
        for (name, net, text) in files {
            let file = HostFile::parse(&text)
                .with_context(|| format!("the bench's host file {name}:\n{text}"))?;
            let counters = self.dir.join(format!("{name}.counters"));
            let stop = Arc::new(AtomicBool::new(false));
            // Inside the host's namespace: its sockets, and its runner threads, live there.
            let host = net
                .enter(|| Host::start(file, Some(counters), &stop))?
                .with_context(|| format!("starting host {name}"))?;
            hosts.0.push((name, stop, host));
        }
        Ok(hosts)
    }
}

/// The top of a host file: its threading.
fn threading(layout: Layout, idle: &Idle, sequencer_host: bool) -> String {
    match layout {
        Layout::Shared => format!("threading = \"shared\"\n[shared]\nidle = \"{idle}\"\n"),
        Layout::Dedicated => "threading = \"dedicated\"\n".to_string(),
        Layout::Split if sequencer_host => format!(
            "threading = \"groups\"\n[[thread]]\nname = \"hot\"\nidle = \"{idle}\"\nroles = [\"seq\", \"serve.senders\"]\n[[thread]]\nname = \"slow\"\nidle = \"sleep:1ms\"\nroles = [\"serve\"]\n"
        ),
        Layout::Split | Layout::Invoker if sequencer_host => threading(Layout::Shared, idle, true),
        Layout::Split => threading(Layout::Shared, idle, false),
        Layout::Invoker => "threading = \"invoker\"\n".to_string(),
    }
}

/// A role's own idle strategy, which it has only under dedicated threading.
fn role_idle(layout: Layout, idle: &Idle) -> String {
    match layout {
        Layout::Dedicated => format!("idle = \"{idle}\"\n"),
        _ => String::new(),
    }
}

/// Running hosts, each with its name and stop flag: stopped and joined on drop, last started
/// first, so that the replicas' clients are gone before the server drains (a server whose
/// replicas still run drains until they hold everything or its timeout passes).
struct Hosts(Vec<(&'static str, Arc<AtomicBool>, Host)>);

impl Hosts {
    /// Stops every host; the first error a host's roles ended with.
    fn stop(mut self) -> Result<()> {
        self.stop_all()
    }

    /// The drivers of application hosts `names`, in that order (each does nothing unless its
    /// host is under invoker threading).
    fn drivers<const N: usize>(&mut self, names: [&str; N]) -> [Driver<'_>; N] {
        let mut found: Vec<(&str, Driver<'_>)> = self
            .0
            .iter_mut()
            .map(|(name, _, host)| (*name, Driver(host.invoker())))
            .collect();
        names.map(|n| {
            let i = found
                .iter()
                .position(|(name, _)| *name == n)
                .unwrap_or_else(|| panic!("no host {n}"));
            found.swap_remove(i).1
        })
    }

    fn stop_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some((_, stop, host)) = self.0.pop() {
            stop.store(true, Ordering::Relaxed);
            let r = host.join();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

/// The roles of an application's host when the application runs them (`threading =
/// "invoker"`): [`drive`](Self::drive) is one duty cycle of each. Under the other layouts the
/// host's own threads run them, and `drive` does nothing.
struct Driver<'h>(Option<&'h mut AgentInvoker<CompositeAgent>>);

impl Driver<'_> {
    /// One duty cycle of every role of the host, if the application runs them. A role's
    /// error ends the measurement.
    #[inline]
    fn drive(&mut self) -> Result<()> {
        if let Some(invoker) = &mut self.0 {
            if let Err(e) = invoker.invoke() {
                anyhow::bail!("the application host's roles: {e}");
            }
        }
        Ok(())
    }
}

/// A tailer of `replica` once its replication client has created it (driving the host's
/// roles if the application runs them).
fn tailer(replica: &Path, host: &mut Driver) -> Result<Tailer> {
    let deadline = Instant::now() + STARTUP;
    loop {
        host.drive()?;
        match Tailer::open_with(replica, TailerOptions::default()) {
            Ok(t) => return Ok(t),
            Err(e) => ensure!(
                Instant::now() < deadline,
                "no replica at {} after {STARTUP:?}: {e}",
                replica.display()
            ),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The stamp of the next frame tagged `tag` in `tailer`, if one has arrived (frames of other
/// tags, and the sequencer's heartbeats, which carry no payload, are passed over), after one
/// duty cycle of the host's roles if the application runs them.
fn poll_tagged(tailer: &mut Tailer, host: &mut Driver, tag: u8) -> Result<Option<u64>> {
    host.drive()?;
    while let Some(f) = tailer.poll()? {
        let p = f.payload();
        if p.len() > 8 && p[8] == tag {
            return Ok(Some(u64::from_le_bytes(
                p[..8].try_into().expect("8 bytes"),
            )));
        }
    }
    Ok(None)
}

/// Opens host `h`'s outbox and a tailer of its replica, and offers a warm-up message until
/// it is in the replica: the path is up.
fn warm_up(h: &AppHost, host: &mut Driver) -> Result<(Outbox, Tailer)> {
    let mut out = h.open_outbox()?;
    let mut tailer = tailer(&h.replica, host)?;
    let mut payload = [0u8; 64];
    payload[8] = WARM_UP;
    offer_until_accepted(&mut out, &payload);
    let deadline = Instant::now() + STARTUP;
    while poll_tagged(&mut tailer, host, WARM_UP)?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "the first message did not reach the replica in {STARTUP:?}"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok((out, tailer))
}

/// The latency of `offer_to_own_replica` and its two hops, split at the frame's timestamp
/// (the sequencer's wall clock when it appended the frame), each ns.
struct OwnReplica {
    /// `offer()` → seen in A's replica.
    whole: Histogram<u64>,
    /// `offer()` → the sequencer's timestamp: forwarder, UDP, sequencer.
    to_sequenced: Histogram<u64>,
    /// The sequencer's timestamp → seen in A's replica: store, sender, TCP, replication
    /// client, replica, tailer.
    sequenced_to_replica: Histogram<u64>,
}

/// `offer()` on host A → seen in A's replica, one message in flight. The split at the frame's
/// timestamp compares two clocks (the sequencer's TSC-derived wall clock and
/// `CLOCK_REALTIME` here), which agree to well under a microsecond in one process.
/// With `group`, the sequencer is a two-member sequencer group under that release policy
/// (shared threading, plain security), its standby on the second sequencer host. With
/// `one_thread`, A's application offers, then polls A's replica until the message is there,
/// on one thread, the shape of Aeron's ping (run under [`Layout::Invoker`], that thread also
/// runs A's roles: nothing on A waits for another of A's threads, so the path has two
/// threads, as its floor, [`one_way_floor`] on one thread, has).
#[allow(clippy::too_many_arguments)]
fn offer_to_own_replica(
    root: &Scratch,
    net: &Network,
    name: &str,
    layout: Layout,
    security: Security,
    group: Option<Release>,
    one_thread: bool,
    idle: &Idle,
    samples: u64,
) -> Result<OwnReplica> {
    let site = Site::new(root, name, net, security)?;
    let (etcd, mut hosts) = match group {
        None => (None, site.start(layout, idle, 1)?),
        Some(release) => {
            let (etcd, hosts) = site.start_group(net, release, idle)?;
            (Some(etcd), hosts)
        }
    };
    let a = &site.hosts[0];
    let [mut host_a] = hosts.drivers([a.name]);
    let mut split = Split::new(samples);
    // In A's namespace: what A's roles connect when this thread runs them lives there.
    let whole = a.net.enter(|| -> Result<Histogram<u64>> {
        let (mut out, mut tailer) = warm_up(a, &mut host_a)?;
        let mut payload = [0u8; 64];
        ping_either(
            one_thread,
            samples,
            Pinning::waiting(idle),
            |stamp| offer_ping(&mut out, &mut payload, stamp),
            || host_a.drive().and_then(|()| split.next_ping(&mut tailer)),
        )
    });
    // The hosts' errors first: a role that failed explains a ping that stalled.
    hosts.stop()?;
    let whole = whole??;
    drop(etcd);
    Ok(split.with_whole(whole))
}

/// Offers a ping on stream 1: `stamp` in bytes 0..8, the tag [`PING`] at 8, and the wall
/// clock (ns) in 16..24, which [`Split`] reads.
fn offer_ping(out: &mut Outbox, payload: &mut [u8; 64], stamp: u64) {
    payload[..8].copy_from_slice(&stamp.to_le_bytes());
    payload[8] = PING;
    payload[16..24].copy_from_slice(&wall_clock_ns().to_le_bytes());
    offer_until_accepted(out, payload);
}

/// `offer_to_own_replica`'s two hops, split at the frame's timestamp, recorded for each ping
/// after the warm-up (a tenth of the samples, as [`ping`] has).
struct Split {
    to_sequenced: Histogram<u64>,
    sequenced_to_replica: Histogram<u64>,
    seen: u64,
    warm_up: u64,
}

impl Split {
    fn new(samples: u64) -> Split {
        Split {
            to_sequenced: histogram(),
            sequenced_to_replica: histogram(),
            seen: 0,
            warm_up: samples / 10,
        }
    }

    /// The stamp of the next ping in `tailer` if one has arrived (other frames are passed
    /// over), its hops recorded.
    fn next_ping(&mut self, tailer: &mut Tailer) -> Result<Option<u64>> {
        while let Some(f) = tailer.poll()? {
            let p = f.payload();
            if p.len() < 24 || p[8] != PING {
                continue;
            }
            let now = wall_clock_ns();
            self.seen += 1;
            if self.seen > self.warm_up {
                let offered = u64::from_le_bytes(p[16..24].try_into().expect("8 bytes"));
                let sequenced = f.timestamp_ns();
                self.to_sequenced
                    .record(sequenced.saturating_sub(offered).max(1))?;
                self.sequenced_to_replica
                    .record(now.saturating_sub(sequenced).max(1))?;
            }
            return Ok(Some(u64::from_le_bytes(
                p[..8].try_into().expect("8 bytes"),
            )));
        }
        Ok(None)
    }

    fn with_whole(self, whole: Histogram<u64>) -> OwnReplica {
        OwnReplica {
            whole,
            to_sequenced: self.to_sequenced,
            sequenced_to_replica: self.sequenced_to_replica,
        }
    }
}

/// A ping offered on A, seen in B's replica, answered with a pong offered on B, seen in A's
/// replica: the round trip, one ping in flight. With `one_thread`, A's application offers
/// and polls on one thread, Aeron's ping (run under [`Layout::Invoker`], that thread also
/// runs A's roles, as B's ponger runs B's).
fn pingpong(
    root: &Scratch,
    net: &Network,
    name: &str,
    layout: Layout,
    one_thread: bool,
    idle: &Idle,
    samples: u64,
) -> Result<hdrhistogram::Histogram<u64>> {
    let site = Site::new(root, name, net, Security::Plain)?;
    let mut hosts = site.start(layout, idle, 2)?;
    let [a, b] = &site.hosts;
    let [mut host_a, mut host_b] = hosts.drivers([a.name, b.name]);
    // Each host's setup and loop in its namespace (see `offer_to_own_replica`).
    let (mut out_a, mut tail_a) = a.net.enter(|| warm_up(a, &mut host_a))??;
    let (mut out_b, mut tail_b) = b.net.enter(|| warm_up(b, &mut host_b))??;
    let stop = AtomicBool::new(false);
    let yielding = Pinning::waiting(idle).yield_while_waiting;
    let h = std::thread::scope(|s| {
        // A failure of B's roles ends the ponger with its error; the ping then stalls and
        // fails, and the ponger's error is the one reported.
        let ponger = s.spawn(|| {
            b.net.enter(|| -> Result<()> {
                let mut payload = [0u8; 64];
                payload[8] = PONG;
                while !stop.load(Ordering::Relaxed) {
                    match poll_tagged(&mut tail_b, &mut host_b, PING)? {
                        Some(stamp) => {
                            payload[..8].copy_from_slice(&stamp.to_le_bytes());
                            offer_until_accepted(&mut out_b, &payload);
                        }
                        None if yielding => std::thread::yield_now(),
                        None => std::hint::spin_loop(),
                    }
                }
                Ok(())
            })
        });
        let mut payload = [0u8; 64];
        payload[8] = PING;
        let h = a.net.enter(|| {
            ping_either(
                one_thread,
                samples,
                Pinning::waiting(idle),
                move |stamp| {
                    payload[..8].copy_from_slice(&stamp.to_le_bytes());
                    offer_until_accepted(&mut out_a, &payload);
                },
                || poll_tagged(&mut tail_a, &mut host_a, PONG),
            )
        });
        stop.store(true, Ordering::Relaxed);
        let ponged = ponger.join().expect("ponger thread").and_then(|r| r);
        ponged.and(h)
    });
    hosts.stop()?;
    h?
}

/// The floor's relay: the sequencer host's hop, UDP in and TCP out, on a thread of its own
/// until dropped. A datagram carries the stamp (8 bytes) and the index of the TCP connection
/// to write it to (1 byte: [`send_to_relay`]).
struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(udp: UdpSocket, mut out: Vec<TcpStream>, yielding: bool) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !s.load(Ordering::Relaxed) {
                match udp.recv(&mut buf) {
                    Ok(9) => out[buf[8] as usize]
                        .write_all(&buf[..8])
                        .expect("relay tcp write"),
                    Ok(n) => panic!("relay: a {n}-byte datagram"),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if yielding {
                            std::thread::yield_now()
                        } else {
                            std::hint::spin_loop()
                        }
                    }
                    Err(e) => panic!("relay udp recv: {e}"),
                }
            }
        });
        Relay {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends `stamp` to the relay, to be written to its TCP connection `out`.
fn send_to_relay(tx: &UdpSocket, stamp: u64, out: u8) {
    let mut d = [out; 9];
    d[..8].copy_from_slice(&stamp.to_le_bytes());
    tx.send(&d).expect("udp send");
}

/// A TCP connection from `to` (where it is accepted) to `from` (which connects, reaching
/// `to` at `to_addr`), each end made in its own host: (`to`'s write end, `from`'s
/// non-blocking read end).
fn tcp_pair(
    to: &NetHost,
    bind: IpAddr,
    to_addr: IpAddr,
    from: &NetHost,
) -> Result<(TcpStream, TcpStream)> {
    let l = to.enter(|| TcpListener::bind((bind, 0)))??;
    let port = l.local_addr()?.port();
    let rx = from.enter(|| TcpStream::connect((to_addr, port)))??;
    let (tx, _) = l.accept()?;
    tx.set_nodelay(true)?;
    rx.set_nonblocking(true)?;
    Ok((tx, rx))
}

/// A UDP socket of `from`, bound to its address and connected to `target`.
fn udp_sender(from: &NetHost, target: SocketAddr) -> Result<UdpSocket> {
    let ip = from.ip;
    Ok(from.enter(|| -> std::io::Result<UdpSocket> {
        let tx = UdpSocket::bind((ip, 0))?;
        tx.connect(target)?;
        Ok(tx)
    })??)
}

/// A UDP socket of `from`, connected to `rx` (of `to`, non-blocking), which `from` reaches
/// at `to_addr`: (sender, receiver).
fn udp_pair(
    to: &NetHost,
    bind: IpAddr,
    to_addr: IpAddr,
    from: &NetHost,
) -> Result<(UdpSocket, UdpSocket)> {
    let rx = to.enter(|| UdpSocket::bind((bind, 0)))??;
    rx.set_nonblocking(true)?;
    let tx = udp_sender(from, SocketAddr::new(to_addr, rx.local_addr()?.port()))?;
    Ok((tx, rx))
}

/// The floor of `offer_to_own_replica`: UDP from host A to the relay on the sequencer host,
/// TCP from it back to A; with `one_thread` (the floor of its one-thread case), one thread of
/// A sends and reads.
fn one_way_floor(
    samples: u64,
    idle: &Idle,
    net: &Network,
    one_thread: bool,
) -> Result<Histogram<u64>> {
    let pins = Pinning::waiting(idle);
    let (tx, relay_udp) = udp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h1)?;
    let (to_a, from_relay) = tcp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h1)?;
    let _relay = Relay::start(relay_udp, vec![to_a], pins.yield_while_waiting);
    let mut reader = StampReader::new(from_relay);
    ping_either(
        one_thread,
        samples,
        pins,
        move |stamp| send_to_relay(&tx, stamp, 0),
        move || Ok(reader.poll()),
    )
}

/// The floor of `pingpong`: A → relay → B, then B → relay → A, B answering on its own thread;
/// with `one_thread`, A sends and reads on one thread.
fn pingpong_floor(
    samples: u64,
    idle: &Idle,
    net: &Network,
    one_thread: bool,
) -> Result<Histogram<u64>> {
    let pins = Pinning::waiting(idle);
    let relay_udp = net.seq.enter(|| UdpSocket::bind((net.seq.ip, 0)))??;
    relay_udp.set_nonblocking(true)?;
    let port = relay_udp.local_addr()?.port();
    let a_tx = udp_sender(&net.h1, SocketAddr::new(net.seq.ip, port))?;
    let b_tx = udp_sender(&net.h2, SocketAddr::new(net.seq.ip, port))?;
    let (to_a, a_rx) = tcp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h1)?;
    let (to_b, b_rx) = tcp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h2)?;
    let relay = Relay::start(relay_udp, vec![to_a, to_b], pins.yield_while_waiting);
    let stop = Arc::new(AtomicBool::new(false));
    let b = {
        let stop = stop.clone();
        let mut reader = StampReader::new(b_rx);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match reader.poll() {
                    Some(stamp) => send_to_relay(&b_tx, stamp, 0),
                    None if pins.yield_while_waiting => std::thread::yield_now(),
                    None => std::hint::spin_loop(),
                }
            }
        })
    };
    let mut reader = StampReader::new(a_rx);
    let h = ping_either(
        one_thread,
        samples,
        pins,
        move |stamp| send_to_relay(&a_tx, stamp, 1),
        move || Ok(reader.poll()),
    );
    stop.store(true, Ordering::Relaxed);
    b.join().expect("pong thread");
    drop(relay);
    h
}

/// Where the time of `case` goes: each hop against the raw hop it rides on.
fn emit_split(
    reporter: &Reporter,
    case: &str,
    h: &OwnReplica,
    udp_floor: &Histogram<u64>,
    tcp_floor: &Histogram<u64>,
) -> Result<()> {
    emit_percentiles(
        reporter,
        BENCH,
        &format!("{case}_offer_to_sequenced"),
        &h.to_sequenced,
        udp_floor,
    )?;
    emit_percentiles(
        reporter,
        BENCH,
        &format!("{case}_sequenced_to_replica"),
        &h.sequenced_to_replica,
        tcp_floor,
    )
}

pub(crate) fn run(args: &Args, reporter: &Reporter) -> Result<()> {
    let (samples, segment) = if args.quick {
        (1_000, crate::QUICK_SEGMENT)
    } else {
        (args.samples, SEGMENT)
    };
    let scratch = tempfile::Builder::new()
        .prefix("seqstream-bench-e2e-")
        .tempdir()
        .context("creating a scratch dir")?;
    let root = &Scratch {
        dir: scratch.path(),
        segment,
        ack: args.ack,
    };
    let idle = &args.idle;
    let net = &Network::of_kind(args.network, &format!("se{}", std::process::id() % 100_000))?;
    eprintln!(
        "bench e2e: hosts on {}",
        if net.is_netns() {
            "network namespaces on one bridge"
        } else {
            "loopback addresses"
        }
    );
    let floor = one_way_floor(samples, idle, net, false)?;

    let layout = match args.layout {
        LayoutChoice::Shared => Layout::Shared,
        LayoutChoice::Dedicated => Layout::Dedicated,
        LayoutChoice::Split => Layout::Split,
        LayoutChoice::Invoker => Layout::Invoker,
        LayoutChoice::All => {
            let mut best = (u64::MAX, Layout::Shared);
            for layout in Layout::ALL {
                let h = offer_to_own_replica(
                    root,
                    net,
                    &format!("survey-{}", layout.name()),
                    layout,
                    Security::Plain,
                    None,
                    false,
                    idle,
                    (samples / 4).max(100),
                )?;
                let p50 = h.whole.value_at_quantile(0.5);
                reporter.emit(&Figure::new(
                    BENCH,
                    format!("offer_to_own_replica_64B_{}", layout.name()),
                    "p50",
                    "ns",
                    p50 as f64,
                    floor.value_at_quantile(0.5) as f64,
                    Better::Lower,
                ));
                best = best.min((p50, layout));
            }
            best.1
        }
    };
    eprintln!(
        "bench e2e: every case below runs on the {} layout, idle {idle}",
        layout.name()
    );
    let (tx, rx) = udp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h1)?;
    let udp_floor = udp_one_way_over(tx, rx, samples, Pinning::waiting(idle))?;
    let (tx, rx) = tcp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.h1)?;
    let tcp_floor = tcp_one_way_over(tx, rx, samples, Pinning::waiting(idle))?;
    for security in [Security::Plain, Security::SourceKeys, Security::Tls] {
        let h = offer_to_own_replica(
            root,
            net,
            &format!("own{}", security.suffix()),
            layout,
            security,
            None,
            false,
            idle,
            samples,
        )?;
        let case = format!("offer_to_own_replica_64B{}", security.suffix());
        emit_percentiles(reporter, BENCH, &case, &h.whole, &floor)?;
        if security == Security::Plain {
            emit_split(reporter, &case, &h, &udp_floor, &tcp_floor)?;
        }
    }
    // A sequencer group: what standby-ack adds over immediate is the standby's round trip
    // (the leader's frame to the standby, its ack back) before the sender may send.
    let mut p50 = [0u64; 2];
    for (i, release) in [Release::Immediate, Release::StandbyAck]
        .into_iter()
        .enumerate()
    {
        let h = offer_to_own_replica(
            root,
            net,
            &format!("own{}", release.suffix()),
            Layout::Shared,
            Security::Plain,
            Some(release),
            false,
            idle,
            samples,
        )?;
        emit_percentiles(
            reporter,
            BENCH,
            &format!("offer_to_own_replica_64B{}", release.suffix()),
            &h.whole,
            &floor,
        )?;
        p50[i] = h.whole.value_at_quantile(0.5);
    }
    let (tx, rx) = tcp_pair(&net.seq, net.seq.ip, net.seq.ip, &net.seq2)?;
    let standby_tcp = tcp_one_way_over(tx, rx, samples, Pinning::waiting(idle))?;
    reporter.emit(&Figure::new(
        BENCH,
        "standby_ack_cost_64B",
        "p50",
        "ns",
        p50[1].saturating_sub(p50[0]) as f64,
        2.0 * standby_tcp.value_at_quantile(0.5) as f64,
        Better::Lower,
    ));
    // Host A's application on one thread, whatever the layout above: the shape of Aeron's
    // ping, against a floor of the same shape.
    let floor_one_thread = one_way_floor(samples, idle, net, true)?;
    let h = offer_to_own_replica(
        root,
        net,
        "own_one_thread",
        Layout::Invoker,
        Security::Plain,
        None,
        true,
        idle,
        samples,
    )?;
    let case = "offer_to_own_replica_64B_one_thread";
    emit_percentiles(reporter, BENCH, case, &h.whole, &floor_one_thread)?;
    emit_split(reporter, case, &h, &udp_floor, &tcp_floor)?;
    let rt_floor = pingpong_floor(samples, idle, net, false)?;
    let h = pingpong(root, net, "pingpong", layout, false, idle, samples)?;
    emit_percentiles(reporter, BENCH, "pingpong_64B", &h, &rt_floor)?;
    let rt_floor = pingpong_floor(samples, idle, net, true)?;
    let h = pingpong(
        root,
        net,
        "pingpong_one_thread",
        Layout::Invoker,
        true,
        idle,
        samples,
    )?;
    emit_percentiles(reporter, BENCH, "pingpong_64B_one_thread", &h, &rt_floor)?;
    Ok(())
}
