//! Step 3 of opening a store for writing: repair what [`validate`](super::validate) found,
//! with writable mappings of the segments it changes (the last two live ones and a prepared
//! successor; the sealed ones are opened one at a time, read-only, to check their indexes).
//! Deletes interrupted preparations, finishes an interrupted roll, rebuilds damaged indexes,
//! records the seals of the sealed segments validation had to scan, and cuts the active
//! segment at its valid prefix (zeroing what follows). Called only once validation has
//! passed, under the store's lock.

use std::path::Path;

use super::validate::{index_is_sound, Store};
use super::{finish, rebuild_index, remove_leftovers, Recovered, RecoveryReport};
use crate::config::StoreConfig;
use crate::error::Result;
use crate::format::{Activation, SegmentState, FORMAT_VERSION};
use crate::layout::Listing;
use crate::lock::DirLock;
use crate::scan::{file_offset, ScanEnd};
use crate::seal::{self, SealRecord};
use crate::segment::Segment;

/// Repairs the validated store in `dir`, which `listing` lists.
pub(super) fn repair(
    dir: &Path,
    cfg: &StoreConfig,
    lock: DirLock,
    store: Store,
    listing: &Listing,
    mut report: RecoveryReport,
) -> Result<Recovered> {
    let Store {
        mut heads,
        live,
        active_scan,
        sealed_end,
        trusted,
        scanned,
    } = store;
    report.sealed_trusted = trusted;
    remove_leftovers(listing, heads[live - 1].1.index, &mut report)?;
    if live >= 2 && heads[live - 2].2 == SegmentState::Active {
        // SAFETY: we hold the store lock: we are the single appender.
        let s = unsafe { Segment::open_writable(&heads[live - 2].0) }?;
        s.publish_state(SegmentState::Sealed);
        heads[live - 2].2 = SegmentState::Sealed;
        report.completed_roll = true;
    }
    // Each sealed segment's index, one segment open at a time (read-only: rebuilding an
    // index only reads its segment), and the seal record of each that had to be scanned.
    for (k, (path, info, state)) in heads.iter().enumerate().take(live) {
        if *state == SegmentState::Sealed {
            let s = Segment::open(path)?;
            if !index_is_sound(dir, &s, info) {
                rebuild_index(dir, &s, info, cfg.index_stride, path)?;
                report.indexes_rebuilt.push(info.index);
            }
            if scanned.binary_search(&k).is_ok() {
                let successor = &heads[k + 1].1;
                let record = SealRecord {
                    end_position: successor.base_position,
                    next_seq: successor.base_seq,
                    header_crc: s.header_crc(),
                };
                match seal::record(dir, path, info.index, &record) {
                    Ok(()) => report.seals_recorded.push(info.index),
                    Err(_) => report.seal_record_failures.push(info.index),
                }
            }
        }
    }
    let prepared = if heads.len() > live {
        // SAFETY: we hold the store lock: we are the single appender.
        Some(unsafe { Segment::open_writable(&heads[live].0) }?)
    } else {
        None
    };
    let (active_path, info, _) = &heads[live - 1];
    let info = *info;
    if let Some(end) = sealed_end {
        // The last live segment is sealed (a power loss kept the seal, not the activation of
        // its successor): activate the successor, prepared or new.
        let next = match prepared {
            Some(p) => p,
            None => Segment::prepare(
                dir,
                cfg.stream_id,
                info.index + 1,
                cfg.segment_size,
                cfg.pretouch,
            )?,
        };
        let created = if cfg.explicit_clock {
            end.last_timestamp_ns
        } else {
            cfg.clock.clone().realtime_ns()
        };
        next.activate(&Activation {
            base_position: end.end_position,
            base_seq: end.next_seq,
            created_ns: created,
            term: info.term,
            version: FORMAT_VERSION,
        });
        report.completed_roll = true;
        let end = ScanEnd { fault: None, ..end };
        return finish(dir, cfg, lock, next, None, Some(end), report);
    }
    let scan = active_scan.expect("the last live segment is active");
    // SAFETY: we hold the store lock: we are the single appender.
    let active = unsafe { Segment::open_writable(active_path) }?;
    if let Some((pos, fault)) = scan.end.fault {
        report.cut = Some((pos, fault.to_string()));
    }
    if scan.end.end_position < active.committed() {
        report.lost_committed = true;
        report
            .cut
            .get_or_insert((scan.end.end_position, "no frame (zeros)".into()));
    }
    active.zero_tail(file_offset(&info, scan.end.end_position));
    active.publish_committed(scan.end.end_position);
    if cfg.pretouch {
        // SAFETY: single appender; the range is above the committed position.
        unsafe {
            active
                .mapped()
                .pretouch(file_offset(&info, scan.end.end_position), active.file_len())
        };
    }
    finish(dir, cfg, lock, active, prepared, Some(scan.end), report).map(|mut r| {
        for e in &scan.entries {
            r.index.push(*e);
        }
        r.next_index_position = scan.next_index_position;
        r
    })
}
