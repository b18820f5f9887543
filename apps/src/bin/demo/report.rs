//! The demo's audit of a stopped run: what the stores prove (through `seqstream_apps::audit`
//! and `seqstream_store::verify`), printed as text and as the final JSON line. It reads the
//! stores and the applications' summaries only; it starts and stops nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use seqstream_apps::audit;
use seqstream_store::digest::{digest, StoreDigest};
use serde_json::{json, Value};

use crate::topology::ITCH_SOURCE;
use crate::{u, Run};

/// Whether two stores' live files (active and sealed segments, their indexes) have the same
/// names and the same bytes.
fn same_live_files(a: &Path, b: &Path) -> Result<bool> {
    let (fa, fb) = (
        seqstream_store::layout::live_files(a)?,
        seqstream_store::layout::live_files(b)?,
    );
    if fa.len() != fb.len()
        || fa
            .iter()
            .zip(&fb)
            .any(|(x, y)| x.file_name() != y.file_name())
    {
        return Ok(false);
    }
    for (x, y) in fa.iter().zip(&fb) {
        if std::fs::read(x)? != std::fs::read(y)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The audit of the stopped run, printed as text and as the final JSON line.
pub(crate) fn audit_run(
    run: &Run<'_>,
    feed: Option<&Value>,
    itch_feed: Option<&Value>,
    algo: &Value,
    oms: &Value,
    floor: &Value,
    started: Instant,
) -> Result<bool> {
    let l = &run.l;
    let feeds = run.cli.feeds;
    let (md_dir, orders_dir, composite_dir, itch_dir) = (
        l.store("seq", "md"),
        l.store("seq", "orders"),
        l.store("h2", "composite"),
        l.store("seq", "itch"),
    );
    let md = feed.map(|_| audit::stream(&md_dir)).transpose()?;
    let itch = itch_feed.map(|_| audit::stream(&itch_dir)).transpose()?;
    let orders = audit::stream(&orders_dir)?;
    let composite = audit::stream(&composite_dir)?;
    let components = run.components();
    let components: Vec<(u32, &Path)> = components
        .iter()
        .map(|(id, p)| (*id, p.as_path()))
        .collect();
    let merged = audit::composite(&composite_dir, &components)?;
    let flow = audit::orders(&orders_dir)?;

    // Per source: what it says it offered against what the stream holds.
    let mut sources = Vec::new();
    if let (Some(f), Some(md)) = (feed, &md) {
        sources.push(("feedhandler", md, 1u32, u(f, "last_source_seq")));
    }
    if let (Some(f), Some(itch)) = (itch_feed, &itch) {
        sources.push((
            "feedhandler-itch",
            itch,
            ITCH_SOURCE,
            u(f, "last_source_seq"),
        ));
    }
    sources.push(("algo", &orders, 11, u(algo, "last_source_seq")));
    sources.push(("oms", &orders, 21, u(oms, "last_source_seq")));
    let (mut lost, mut duplicated, mut gaps) = (0u64, 0u64, 0u64);
    println!("\n== sources (offered → sequenced)");
    for (name, stream, id, offered) in sources {
        let a = stream.sources.get(&id).copied().unwrap_or_default();
        let missing =
            offered.saturating_sub(a.messages) + a.last_source_seq.saturating_sub(offered);
        lost += missing;
        duplicated += a.duplicates;
        gaps += a.missing;
        println!("  {name:<16} source {id:>2}: offered {offered:>6}, sequenced {:>6}, duplicates dropped in stream {:>3}, missing {missing}", a.messages, a.duplicates);
    }
    // The ITCH stream against the captures themselves: every message the feed handler's
    // MoldUDP64 arbitration keeps, once, byte for byte, in order of source seq.
    let mut itch_altered = 0;
    let mut algo_saw_itch = true;
    if let (Some(f), Some(itch)) = (itch_feed, &itch) {
        let files =
            seqstream_apps::feed::capture_files(std::slice::from_ref(&run.cli.itch_capture))?;
        let expected = seqstream_apps::feed::itch_messages(&files, None)?;
        let p = audit::payloads(&itch_dir, ITCH_SOURCE, u(f, "first_source_seq"), &expected)?;
        lost += p.missing;
        duplicated += p.duplicates;
        itch_altered = p.mismatched;
        algo_saw_itch = u(algo, "itch_messages") == itch.messages;
        println!(
            "  itch stream vs the captures: {} of {} ITCH messages present once and unchanged, {} missing, {} duplicated, {} altered or foreign; the algo saw {} ({:?})",
            p.matched,
            expected.len(),
            p.missing,
            p.duplicates,
            p.mismatched,
            u(algo, "itch_messages"),
            algo["itch_by_type"].as_object().map(|m| m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")).unwrap_or_default()
        );
    }
    lost += merged.missing;
    duplicated += merged.duplicates;
    println!(
        "  composite: {} component messages merged from streams {}, {} missing, {} duplicated, {} altered",
        merged.merged,
        components.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>().join(" + "),
        merged.missing,
        merged.duplicates,
        merged.mismatched
    );

    println!("\n== stores (storetool verify, digest)");
    let mut verified = true;
    let mut digests: BTreeMap<String, StoreDigest> = BTreeMap::new();
    for host in ["seq", "seq2", "h1", "h2"] {
        for stream in ["md", "orders", "composite", "itch"] {
            let dir = l.store(host, stream);
            if !dir.exists() {
                continue;
            }
            let v = seqstream_store::verify::verify(&dir)
                .with_context(|| format!("verifying {}", dir.display()))?;
            verified &= v.is_ok();
            let d = digest(&dir)?;
            println!(
                "  {host}/{stream:<10} verify {:<4} {d}",
                if v.is_ok() { "ok" } else { "FAIL" }
            );
            for f in &v.faults {
                println!("    FAULT {f}");
            }
            digests.insert(format!("{host}/{stream}"), d);
        }
    }
    let mut identical = true;
    for (primary, replica) in run.replica_pairs() {
        let key = |p: &Path| {
            format!(
                "{}/{}",
                p.parent()
                    .and_then(|h| h.file_name())
                    .unwrap_or_default()
                    .to_string_lossy(),
                p.file_name().unwrap_or_default().to_string_lossy()
            )
        };
        let same_digest = matches!(
            (digests.get(&key(&primary)), digests.get(&key(&replica))),
            (Some(a), Some(b)) if a == b
        );
        let same_files = same_live_files(&primary, &replica)?;
        identical &= same_digest && same_files;
        println!(
            "  {} vs {}: digest {}, live segment and index files {}",
            key(&replica),
            key(&primary),
            if same_digest { "equal" } else { "DIFFERENT" },
            if same_files {
                "byte-identical"
            } else {
                "DIFFERENT"
            }
        );
    }

    println!("\n== order flow");
    println!("  orders {} (algo sent {}), execution reports {}; answered once {}, unanswered {}, answered twice or more {}, unmatched reports {}",
        flow.orders, u(algo, "orders_sent"), flow.reports, flow.answered_once, flow.unanswered, flow.answered_more_than_once, flow.unmatched_reports);
    let flow_ok = if feeds.cme() {
        flow.orders > 0
            && flow.orders == u(algo, "orders_sent")
            && flow.answered_once == flow.orders
            && flow.unmatched_reports == 0
            && flow.repeated_cl_ord_ids == 0
            && flow.undecodable == 0
    } else {
        println!("  --feeds itch: the algo trades on CME books only and saw none, so 0 orders and 0 reports are expected");
        flow.orders == 0
            && flow.reports == 0
            && u(algo, "orders_sent") == 0
            && flow.undecodable == 0
    };

    let e2e = &algo["e2e_ns"];
    let fl = &floor["udp_plus_tcp_oneway_ns"];
    println!(
        "\n== latency, ns (offer() on h1 → seen in h1's replica of the order stream, {} orders)",
        u(e2e, "count")
    );
    for (name, v) in [
        ("e2e", e2e),
        ("  inbound (offer → sequenced)", &algo["inbound_ns"]),
        ("  outbound (sequenced → h1 replica)", &algo["outbound_ns"]),
        ("floor (raw UDP + TCP one-way)", fl),
    ] {
        println!(
            "  {name:<36} p50 {:>9} p99 {:>9} p99.9 {:>9} max {:>9}",
            u(v, "p50"),
            u(v, "p99"),
            u(v, "p999"),
            u(v, "max")
        );
    }
    let ratio = |k: &str| {
        if u(fl, k) > 0 {
            u(e2e, k) as f64 / u(fl, k) as f64
        } else {
            f64::NAN
        }
    };
    println!(
        "  e2e / floor: p50 {:.1}×, p99 {:.1}×",
        ratio("p50"),
        ratio("p99")
    );

    println!("\n== sequencer groups (2 members each, standby-ack)");
    if run.cli.failover {
        for f in &run.failovers {
            println!(
                "  stream {}: failed over to seq2 (term {}) in {:.1} ms (SIGKILL → its first frame)",
                f.stream, f.term, f.ms
            );
        }
        println!(
            "  the killed member cut {} frames it had sequenced but never released, and rejoined as the standby",
            run.frames_cut
        );
    } else {
        println!("  no failover (run with --failover to kill the leaders half way through)");
    }

    let ok = lost == 0
        && duplicated == 0
        && gaps == 0
        && identical
        && verified
        && flow_ok
        && merged.mismatched == 0
        && itch_altered == 0
        && algo_saw_itch;
    let pick = |v: &Value| json!({"p50": u(v, "p50"), "p99": u(v, "p99"), "p999": u(v, "p999"), "max": u(v, "max")});
    let mut streams = json!({"orders": orders.messages, "composite": composite.messages});
    if let Some(md) = &md {
        streams["market_data"] = json!(md.messages);
    }
    if let Some(itch) = &itch {
        streams["itch"] = json!(itch.messages);
    }
    let mut out = json!({
        "demo": if ok { "ok" } else { "failed" },
        "feeds": feeds.name(),
        "network": if run.net.is_netns() { "netns" } else { "loopback" },
        "daemons": 4,
        "sequencer_groups": {"members": 2, "release": "standby-ack"},
        "failovers": run.failovers.len(),
        "failover_ms": run.failovers.iter().map(|f| (f.ms * 10.0).round() / 10.0).collect::<Vec<_>>(),
        "failover_terms": run.failovers.iter().map(|f| f.term).collect::<Vec<_>>(),
        "packets_at_kill": run.packets_at_kill,
        "frames_cut": run.frames_cut,
        "threads": run.threads.iter().map(|(h, n)| (h.to_string(), json!(n.len()))).collect::<serde_json::Map<_, _>>(),
        "threading": run.cli.threading.name(),
        "streams": streams,
        "orders": flow.orders,
        "execution_reports": flow.reports,
        "orders_answered_once": flow.answered_once,
        "lost": lost,
        "duplicated": duplicated,
        "gaps": gaps,
        "stores_verified": verified,
        "replicas_identical": identical,
        "e2e_ns": pick(e2e),
        "inbound_ns": pick(&algo["inbound_ns"]),
        "outbound_ns": pick(&algo["outbound_ns"]),
        "floor_ns": pick(fl),
        "elapsed_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    });
    if let Some(f) = feed {
        out["capture"] = json!({"frames": u(f, "frames"), "packets": u(f, "packets"), "duplicate_packets": u(f, "duplicate_packets"), "missed_packets": u(f, "missed_packets")});
    }
    if let Some(f) = itch_feed {
        out["itch_capture"] = json!({"frames": u(f, "frames"), "packets": u(f, "packets"), "messages": u(f, "messages"), "duplicate_messages": u(f, "duplicate_messages"), "missed_messages": u(f, "missed_messages")});
        out["algo_itch_messages"] = json!(u(algo, "itch_messages"));
    }
    println!("{out}");
    Ok(ok)
}
