//! `netfloor`: the floor of seqstream's end-to-end path, measured over the same network
//! path: one UDP datagram from the application host to the sequencer host, answered over a
//! TCP connection from the sequencer host back to the application host. That is one raw
//! UDP one-way plus one raw TCP one-way, the two hops an order makes (offer → sequencer over
//! UDP, sequencer's store → the application host's replica over TCP), with none of
//! seqstream's work in between.
//!
//! `netfloor serve` runs on the sequencer host: it accepts one TCP connection and echoes
//! every datagram it receives onto it. `netfloor ping` runs on the application host: it
//! sends `--count` datagrams of `--size` bytes one at a time, times each until the echo
//! arrives (ns, `CLOCK_MONOTONIC`), and prints the percentiles as JSON. Both use blocking
//! sockets with `TCP_NODELAY`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use seqstream_apps::latency::{self, Percentiles};

#[derive(Parser)]
#[command(
    name = "netfloor",
    version,
    about = "Raw UDP one-way + TCP one-way over a path: the floor of seqstream's end-to-end latency"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// On the sequencer host: echo datagrams received on --udp onto the connection accepted on --tcp.
    Serve {
        /// UDP address to receive on.
        #[arg(long)]
        udp: SocketAddr,
        /// TCP address to listen on.
        #[arg(long)]
        tcp: SocketAddr,
    },
    /// On the application host: time datagram → echo round trips.
    Ping {
        /// The server's UDP address.
        #[arg(long)]
        udp: SocketAddr,
        /// The server's TCP address.
        #[arg(long)]
        tcp: SocketAddr,
        /// Local address to send from.
        #[arg(long, default_value = "0.0.0.0:0")]
        bind: SocketAddr,
        /// Timed round trips (after 10% as many untimed ones).
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// Datagram size, bytes (8 to 1400).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Give up connecting after this long, ms.
        #[arg(long, default_value_t = 10_000)]
        connect_timeout_ms: u64,
    },
}

fn serve(udp: SocketAddr, tcp: SocketAddr) -> Result<()> {
    let socket = UdpSocket::bind(udp).with_context(|| format!("binding UDP {udp}"))?;
    let listener = TcpListener::bind(tcp).with_context(|| format!("listening on TCP {tcp}"))?;
    let (mut conn, peer) = listener.accept().context("accepting")?;
    conn.set_nodelay(true)?;
    eprintln!("netfloor: echoing to {peer}");
    // Ends when the pinger closes the connection: seen on the next echo, or within a second.
    socket.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut buf = [0u8; 2048];
    loop {
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                conn.set_nonblocking(true)?;
                let closed = matches!(conn.peek(&mut buf[..1]), Ok(0));
                conn.set_nonblocking(false)?;
                if closed {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e).context("receiving"),
        };
        if conn.write_all(&buf[..n]).is_err() {
            return Ok(());
        }
    }
}

fn ping(
    udp: SocketAddr,
    tcp: SocketAddr,
    bind: SocketAddr,
    count: u64,
    size: usize,
    connect_timeout: Duration,
) -> Result<()> {
    if !(8..=1400).contains(&size) {
        bail!("--size must be 8 to 1400 bytes");
    }
    let deadline = Instant::now() + connect_timeout;
    let mut conn = loop {
        match TcpStream::connect_timeout(&tcp, Duration::from_millis(500)) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {tcp}")),
        }
    };
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(Duration::from_millis(200)))?;
    let socket = UdpSocket::bind(bind).with_context(|| format!("binding UDP {bind}"))?;
    socket.connect(udp)?;
    let mut out = vec![0u8; size];
    let mut back = vec![0u8; size];
    let mut h = latency::histogram();
    let (mut lost, warmup) = (0u64, count / 10);
    let mut i = 0u64;
    while i < warmup + count {
        out[..8].copy_from_slice(&i.to_le_bytes());
        let start = Instant::now();
        socket.send(&out)?;
        // A datagram lost on the way never comes back: time out, count it, send the next.
        // Echoes of an earlier, late datagram are skipped by their number.
        let answered = loop {
            match conn.read_exact(&mut back) {
                Ok(()) if back[..8] == out[..8] => break true,
                Ok(()) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break false
                }
                Err(e) => return Err(e).context("reading the echo"),
            }
        };
        if !answered {
            lost += 1;
            if lost > count / 10 + 10 {
                bail!("{lost} datagrams lost: the path is not usable for a floor");
            }
            continue;
        }
        if i >= warmup {
            h.saturating_record(start.elapsed().as_nanos() as u64);
        }
        i += 1;
    }
    let summary = serde_json::json!({
        "app": "netfloor",
        "path": format!("udp {bind} -> {udp}, tcp {tcp} -> {bind}"),
        "size": size,
        "lost": lost,
        "udp_plus_tcp_oneway_ns": Percentiles::of(&h),
    });
    println!("{summary}");
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve { udp, tcp } => serve(udp, tcp),
        Cmd::Ping {
            udp,
            tcp,
            bind,
            count,
            size,
            connect_timeout_ms,
        } => ping(
            udp,
            tcp,
            bind,
            count,
            size,
            Duration::from_millis(connect_timeout_ms),
        ),
    }
}
