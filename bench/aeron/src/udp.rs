//! The floor: a raw UDP ping-pong over loopback between two threads, one 64-byte datagram in
//! flight, both sockets non-blocking and polled (waiting between empty polls as the run says),
//! the same shape as the raw-socket floors of seqstream's benches (`bench/src/oneway.rs`).
//! The ping thread stamps the datagram, the pong thread sends it straight back, and the ping
//! thread records `now - stamp` when it returns: what Aeron's ping-pong does with nothing
//! but the two sockets.

use std::io::ErrorKind;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ScopedJoinHandle;

use anyhow::{ensure, Context, Result};
use hdrhistogram::Histogram;

use crate::{histogram, Run, MESSAGE_LENGTH};

/// Round-trip times (ns) of `run.samples` datagrams after `run.warmup` unrecorded ones.
pub(crate) fn pingpong(run: &Run) -> Result<Histogram<u64>> {
    let ping = UdpSocket::bind("127.0.0.1:0").context("binding the floor's ping socket")?;
    let pong = UdpSocket::bind("127.0.0.1:0").context("binding the floor's pong socket")?;
    ping.connect(pong.local_addr()?)?;
    pong.connect(ping.local_addr()?)?;
    ping.set_nonblocking(true)?;
    pong.set_nonblocking(true)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let ponger = s.spawn(|| echo(&pong, &stop, *run));
        let h = ping_all(&ping, run, &ponger);
        stop.store(true, Ordering::Relaxed);
        let echoed = ponger.join().expect("the floor's pong thread panicked");
        // The pong thread's error, if any, is why the ping failed: report it first.
        echoed.and(h)
    })
}

/// The pong thread: sends every datagram back until `stop`.
fn echo(socket: &UdpSocket, stop: &AtomicBool, run: Run) -> Result<()> {
    let mut buf = [0u8; 2 * MESSAGE_LENGTH];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv(&mut buf) {
            Ok(n) => {
                socket.send(&buf[..n]).context("the floor's pong send")?;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => run.wait.idle(),
            Err(e) => return Err(e).context("the floor's pong receive"),
        }
    }
    Ok(())
}

/// The ping thread: one datagram in flight, each stamped as it is sent.
fn ping_all(
    socket: &UdpSocket,
    run: &Run,
    ponger: &ScopedJoinHandle<'_, Result<()>>,
) -> Result<Histogram<u64>> {
    let mut h = histogram();
    let mut out = [0u8; MESSAGE_LENGTH];
    let mut back = [0u8; 2 * MESSAGE_LENGTH];
    for i in 0..run.warmup + run.samples {
        out[..8].copy_from_slice(&run.now().to_le_bytes());
        socket.send(&out).context("the floor's ping send")?;
        let n = loop {
            match socket.recv(&mut back) {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    ensure!(!ponger.is_finished(), "the floor's pong thread stopped");
                    run.wait.idle();
                }
                Err(e) => return Err(e).context("the floor's ping receive"),
            }
        };
        ensure!(n == MESSAGE_LENGTH, "the floor's pong sent {n} bytes");
        let stamp = u64::from_le_bytes(back[..8].try_into().expect("8 bytes"));
        if i >= run.warmup {
            h.record(run.now().saturating_sub(stamp).max(1))?;
        }
    }
    Ok(h)
}
