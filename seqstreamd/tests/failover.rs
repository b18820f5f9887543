//! SIGKILL of a sequencer group's leader at random instants under load (issue 14): two
//! `seqstreamd` members (or three, one of the two standbys in sync: `sync_standbys = 1`)
//! over a real etcd and a client host whose three applications offer
//! messages all along, through a lossy relay to each member (10 % dropped, 5 % duplicated,
//! 5 % reordered, both ways, NAKs included). Every host is a network namespace (root only;
//! CI runs as root): the members on `seq`, `seq2` (and `h2`), the client and its relays on
//! `h1`, etcd on `coord`, all on one bridge (`seqstream_apps::net`). Each round kills whichever member leads, at a
//! random instant, and restarts it with its store: it rejoins as a standby (cutting a tail the
//! new leader never had). At the end the client holds every message offered, once, in
//! per-source order; every store is a byte-identical prefix of the leader's and passes
//! `verify`. After the kills come planned switchovers (`seqstreamd --switchover`), each
//! handing the leadership to an in-sync member under the same load. It prints one JSON line:
//! the kills, the lease TTL, the failover times (SIGKILL → the new leader's term-start frame,
//! its first) and the switchover times (the request written to etcd → that frame) at p50
//! and max, and for each the applications' stall: from the SIGKILL (or the request) until the
//! client has seen every message offered before it in its replica (`*_to_confirmed_*`). The
//! figures are printed, never asserted.
//!
//! Two tests, one per group size, each with 20 kills by default (about 8 s each in a debug
//! build). `FAILOVER_KILLS` sets the kills, `FAILOVER_SWITCHOVERS` the switchovers (3 by
//! default; `scripts/failover.sh` runs 20 of each in release mode, one test at a time),
//! `FAILOVER_SEED` the random instants.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use rand::{Rng, SeedableRng};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_store::Tailer;
use seqstream_testkit::relay::LossyRelay;
use seqstream_testkit::{counter, wait_counter, KillOnDrop};

const SOURCES: u32 = 3;
/// A failover slower than this (ms) prints the new leader's log.
const SLOW_FAILOVER_MS: f64 = 200.0;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

/// The member that leads and the term it leads, once one leads and the others follow it,
/// eligible, etcd's in-sync set names it and one standby, and every member shows the same
/// leader in the same term, at least `term` (their gauges lag their steps by a cycle: just
/// after a switchover the old leader may still show itself leading, the new one following;
/// a term the test did not cause, a lapsed lease's, is taken as it comes).
fn settled_leader(g: &Group, term: u32) -> (u32, u32) {
    let deadline = Instant::now() + LONG;
    loop {
        let gauge = |n, label| counter(&g.counters(n), label).unwrap_or(0);
        let state = |n| gauge(n, STATE);
        let eligible = |n| gauge(n, "md member eligible") == 1;
        let shown = |n| {
            (
                gauge(n, "md member leader node"),
                gauge(n, "md member leader term"),
            )
        };
        let nodes = g.nodes();
        for &leader in &nodes {
            let (node, now) = shown(leader);
            let others = || nodes.iter().filter(|&&n| n != leader);
            if node == u64::from(leader)
                && now >= u64::from(term)
                && state(leader) == 2
                && others().all(|&o| shown(o) == (node, now) && state(o) == 1 && eligible(o))
                && g.in_sync()
                    .is_some_and(|s| s.len() == 2 && s.contains(&leader))
            {
                return (leader, now as u32);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no settled leader:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The timestamp (realtime ns) of the term-start frame of `term` in the store at `dir`.
fn term_start_ns(dir: &std::path::Path, term: u32) -> Option<u64> {
    let mut t = Tailer::open(dir).ok()?;
    while let Some(f) = t.poll().ok()? {
        if f.term_start().is_some_and(|s| s.term == term) {
            return Some(f.timestamp_ns());
        }
    }
    None
}

/// The term-start frame's timestamp of `term` in the store at `dir`, waited for.
fn wait_term_start(g: &Group, dir: &std::path::Path, term: u32) -> u64 {
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(ns) = term_start_ns(dir, term) {
            return ns;
        }
        assert!(Instant::now() < deadline, "no term {term}:\n{}", g.logs());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A number from the environment, or `default`.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The value of `"key":<number>` in a JSON line.
fn json_number(line: &str, key: &str) -> f64 {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {line}"))
}

/// Each source's highest seq in the client's replica (index `source - 1`).
#[derive(Default)]
struct ReplicaSeqs([AtomicU64; SOURCES as usize]);

impl ReplicaSeqs {
    /// Reads the replica in `dir` (once it exists) as it grows, until `stop`.
    fn follow(&self, dir: &std::path::Path, stop: &AtomicBool) {
        let mut tailer = None;
        while !stop.load(Ordering::Relaxed) {
            if tailer.is_none() {
                tailer = Tailer::open(dir).ok();
            }
            let mut read = 0;
            if let Some(t) = tailer.as_mut() {
                while let Some(f) = t.poll().expect("reading the client's replica") {
                    read += 1;
                    let source = (f.source_id() as usize).wrapping_sub(1);
                    if let Some(seq) = self.0.get(source) {
                        seq.fetch_max(f.source_seq(), Ordering::Relaxed);
                    }
                }
            }
            if read == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// A thread that waits until the replica holds, for every source, its messages up to
    /// `due[source - 1]`, and returns how long after `since_ns` (realtime) that was, ms.
    fn watch(self: &Arc<Self>, due: Vec<u64>, since_ns: u64) -> std::thread::JoinHandle<f64> {
        let me = self.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + LONG;
            loop {
                let seen: Vec<u64> = me.0.iter().map(|s| s.load(Ordering::Relaxed)).collect();
                if seen.iter().zip(&due).all(|(s, d)| s >= d) {
                    return now_ns().saturating_sub(since_ns) as f64 / 1e6;
                }
                assert!(
                    Instant::now() < deadline,
                    "the client's replica holds {seen:?} of {due:?}"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    }
}

/// p50 and max of `v` (sorted here).
fn p50_max(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (
        v.get(v.len() / 2).copied().unwrap_or(0.0),
        v.last().copied().unwrap_or(0.0),
    )
}

#[test]
fn sigkill_of_a_two_member_groups_leader_at_random_instants_loses_and_repeats_nothing() {
    sigkill_the_leader_at_random_instants(2);
}

#[test]
fn sigkill_of_a_three_member_groups_leader_at_random_instants_loses_and_repeats_nothing() {
    sigkill_the_leader_at_random_instants(3);
}

/// The whole run (see the module's documentation) with `n` members: 2, or 3 with
/// `sync_standbys = 1`.
fn sigkill_the_leader_at_random_instants(n: u32) {
    let kills: usize = env_number("FAILOVER_KILLS", 20);
    let switchovers: usize = env_number("FAILOVER_SWITCHOVERS", 3);
    let seed: u64 = env_number("FAILOVER_SEED", now_ns() % 1_000_000);
    // With three members one standby is in sync: the other replicates without gating.
    let extra = if n == 3 { "sync_standbys = 1" } else { "" };
    eprintln!("failover test ({n} members) seed {seed} (set FAILOVER_SEED to replay)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    // Both tests run at once: each makes its own namespaces.
    let tag = format!("f{n}{}", std::process::id() % 100_000);
    let g = Group::in_namespaces(&tag, n as usize);
    let mut members: Vec<KillOnDrop> = (1..=n).map(|m| g.start_with(m, m == 1, extra)).collect();
    g.wait_state(1, 2);
    let relays: Vec<LossyRelay> = (1..=n).map(|m| g.relay(m, seed + u64::from(m))).collect();
    let addrs: Vec<_> = relays.iter().map(LossyRelay::addr).collect();
    for s in 1..=SOURCES {
        drop(Outbox::open_or_create(&g.outbox(s), s, STREAM, 1 << 20, 4096).unwrap());
    }
    let _client = g.start_client(&addrs, SOURCES);
    let client = g.path("client.counters");

    // The applications: each source offers at a steady pace until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let apps: Vec<_> = (1..=SOURCES)
        .map(|source| {
            let (stop, outbox) = (stop.clone(), g.outbox(source));
            let offered = Arc::new(AtomicU64::new(0));
            let count = offered.clone();
            let t = std::thread::spawn(move || {
                let mut o = Outbox::open_or_create(&outbox, source, STREAM, 1 << 20, 4096).unwrap();
                let mut seq = 1;
                while !stop.load(Ordering::Relaxed) {
                    if o.offer(STREAM, 7, payload(source, seq).as_bytes()).is_ok() {
                        count.store(seq, Ordering::Relaxed);
                        seq += 1;
                    }
                    std::thread::sleep(Duration::from_micros(500));
                }
            });
            (t, offered)
        })
        .collect();

    // Each source's highest seq in the client's replica, kept current by a reader of it.
    let seen = Arc::new(ReplicaSeqs::default());
    let reader = {
        let (seen, stop, replica) = (seen.clone(), stop.clone(), g.path("client"));
        std::thread::spawn(move || seen.follow(&replica, &stop))
    };
    // Each source's messages offered so far.
    let offered_now = || -> Vec<u64> {
        apps.iter()
            .map(|(_, n)| n.load(Ordering::Relaxed))
            .collect()
    };
    let mut failovers_ms = Vec::new();
    let mut kill_confirmed_ms = Vec::new();
    let mut term = 1;
    for round in 0..kills {
        let (leader, leads) = settled_leader(&g, term);
        term = leads;
        // A survivor, whose gauges say who leads next.
        let other = if leader == 1 { 2 } else { 1 };
        let before = counter(&client, "fwd messages confirmed").unwrap_or(0);
        wait_counter(&client, "fwd messages confirmed", LONG, |v| v > before + 30);
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        let victim = &mut members[leader as usize - 1];
        victim.0.kill().unwrap();
        victim.0.wait().unwrap();
        let killed_ns = now_ns();
        let confirmed = seen.watch(offered_now(), killed_ns);
        wait_counter(&g.counters(other), "md member leader term", LONG, |t| {
            t > term as u64
        });
        term = counter(&g.counters(other), "md member leader term").unwrap() as u32;
        let next = counter(&g.counters(other), "md member leader node").unwrap() as u32;
        let started = wait_term_start(&g, &g.store(next), term);
        failovers_ms.push(started.saturating_sub(killed_ns) as f64 / 1e6);
        members[leader as usize - 1] = g.start_with(leader, false, extra);
        kill_confirmed_ms.push(confirmed.join().expect("watching the client's replica"));
        eprintln!(
            "kill {round}: node {next} leads term {term}: its first frame after {:.1} ms, everything offered before the kill confirmed after {:.1} ms",
            failovers_ms[round],
            kill_confirmed_ms[round]
        );
        if failovers_ms[round] > SLOW_FAILOVER_MS {
            // Rare (one kill in about 2,000 on 2026-12-03, a lease's full TTL) and not
            // proven understood: what the new leader's log says about it, for the next person.
            let log =
                std::fs::read_to_string(g.path(&format!("member-{next}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "kill {round}: a slow failover; the last lines of member {next}'s log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }

    // Planned switchovers, asked of the leader through its own file.
    let mut switchovers_ms = Vec::new();
    let mut switchover_confirmed_ms = Vec::new();
    for round in 0..switchovers {
        // (The term it leads comes back in the switchover's answer.)
        let (leader, _) = settled_leader(&g, term);
        let before = counter(&client, "fwd messages confirmed").unwrap_or(0);
        wait_counter(&client, "fwd messages confirmed", LONG, |v| v > before + 30);
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        let due = offered_now();
        let asked_ns = now_ns();
        let out = g
            .seqstreamd(leader)
            .arg("--config")
            .arg(g.path(&format!("member-{leader}.toml")))
            .arg("--switchover")
            // The default 5 s is an operator's; a loaded test machine gets longer.
            .args(["--timeout-ms", "30000"])
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "switchover {round}: {line}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            g.logs()
        );
        let to = json_number(&line, "to") as u32;
        assert!(to != leader && (1..=n).contains(&to), "{line}");
        term = json_number(&line, "term") as u32;
        let started = wait_term_start(&g, &g.store(to), term);
        eprintln!("switchover {round}: {line}");
        let requested_ns = json_number(&line, "requested_ns") as u64;
        switchovers_ms.push(started.saturating_sub(requested_ns) as f64 / 1e6);
        // Watched from the request (written to etcd by the command, `requested_ns`).
        let confirmed = seen.watch(due, asked_ns);
        let ms = confirmed.join().expect("watching the client's replica");
        let asked_to_requested_ms = requested_ns.saturating_sub(asked_ns) as f64 / 1e6;
        switchover_confirmed_ms.push((ms - asked_to_requested_ms).max(0.0));
    }

    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader of the client's replica");
    let offered: Vec<u64> = apps
        .into_iter()
        .map(|(t, n)| {
            t.join().unwrap();
            n.load(Ordering::Relaxed)
        })
        .collect();
    let total: u64 = offered.iter().sum();
    wait_counter(&client, "fwd messages confirmed", LONG, |v| v == total);
    let (leader, _) = settled_leader(&g, term);
    let got = common::offered(&g.path("client"));
    let mut next = vec![1u64; SOURCES as usize];
    let (mut lost, mut duplicated) = (0u64, 0u64);
    for &(source, seq) in &got {
        let n = &mut next[source as usize - 1];
        if seq < *n {
            duplicated += 1;
        } else {
            lost += seq - *n;
            *n = seq + 1;
        }
    }
    lost += offered
        .iter()
        .zip(&next)
        .map(|(o, n)| o + 1 - n)
        .sum::<u64>();
    let (failover_p50, failover_max) = p50_max(&mut failovers_ms);
    let (switchover_p50, switchover_max) = p50_max(&mut switchovers_ms);
    let (kill_confirmed_p50, kill_confirmed_max) = p50_max(&mut kill_confirmed_ms);
    let (switchover_confirmed_p50, switchover_confirmed_max) =
        p50_max(&mut switchover_confirmed_ms);
    // The members' own measure of each promotion: from winning to a sequencer ready.
    let mut promotions_ms: Vec<f64> = g
        .logs()
        .split("promoted_in_us=")
        .skip(1)
        .filter_map(|rest| {
            let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
            Some(digits.parse::<f64>().ok()? / 1e3)
        })
        .collect();
    assert!(
        promotions_ms.len() >= kills + switchovers,
        "{} promotions logged for {kills} kills and {switchovers} switchovers",
        promotions_ms.len()
    );
    let (promotion_p50, promotion_max) = p50_max(&mut promotions_ms);
    // Tails cut by members rejoining a new leader: a killed leader's unreleased tail (at most
    // one a kill), or a standby's that was sent what no later leader held.
    let tails_cut = g
        .logs()
        .matches("rejoined the upstream: cut this replica's tail")
        .count();
    println!(
        "{{\"bench\":\"failover\",\"case\":\"sigkill_leader\",\"members\":{n},\"sync_standbys\":1,\"kills\":{kills},\"switchovers\":{switchovers},\"lease_ttl_s\":1,\"sources\":{SOURCES},\"relay_drop\":{},\"messages\":{total},\"lost\":{lost},\"duplicated\":{duplicated},\"failover_p50_ms\":{failover_p50:.1},\"failover_max_ms\":{failover_max:.1},\"switchover_p50_ms\":{switchover_p50:.1},\"switchover_max_ms\":{switchover_max:.1},\"kill_to_confirmed_p50_ms\":{kill_confirmed_p50:.1},\"kill_to_confirmed_max_ms\":{kill_confirmed_max:.1},\"switchover_to_confirmed_p50_ms\":{switchover_confirmed_p50:.1},\"switchover_to_confirmed_max_ms\":{switchover_confirmed_max:.1},\"promotion_p50_ms\":{promotion_p50:.2},\"promotion_max_ms\":{promotion_max:.2},\"tails_cut\":{tails_cut},\"seed\":{seed}}}",
        seqstream_testkit::relay::DROPPED,
    );
    assert_eq!((lost, duplicated), (0, 0), "per-source order broken");
    let standbys = (1..=n).filter(|&m| m != leader).map(|m| g.store(m));
    for dir in std::iter::once(g.path("client")).chain(standbys) {
        // The leader's store is read last: it only grows (heartbeats go on).
        let ours = frames(&dir);
        let leader_frames = frames(&g.store(leader));
        assert!(
            ours.len() <= leader_frames.len() && ours[..] == leader_frames[..ours.len()],
            "{} is not a prefix of the leader's store",
            dir.display()
        );
        let v = seqstream_store::verify::verify(&dir).unwrap();
        assert!(v.is_ok(), "{}: {:?}", dir.display(), v.faults);
    }
}
