//! Timelines: what a run of many batches spent its wall-clock time on, batch by batch.
//!
//! A profile ([`crate::profile`]) times the nodes of one batch; it cannot say why a run of
//! many batches takes longer than the sum of its batches' device time. A **timeline**
//! records, for every batch a runnable runs while recording is on, when each of its
//! phases began and ended on the host's clock, and on which lane:
//!
//! - [`Phase::Upload`]: packing the samples and moving the packed batch to the plan;
//! - [`Phase::Turn`]: waiting for the lane's turn on the device, where the lanes' runs take
//!   turns (`crate::backend::turns`): another batch's run;
//! - [`Phase::Run`]: the plan's run, up to its work being done (the backend is asked to
//!   [`crate::backend::Backend::settle`] while recording, so that a device's queued work
//!   is counted here and not in the download that would otherwise wait for it);
//! - [`Phase::Download`]: bringing the outputs back and cropping each sample's;
//! - [`Phase::Prepare`]: a plan prepared for a batch shape met the first time (or again,
//!   once the plan cache dropped it), on whichever thread prepares it: a lane, the caller,
//!   one by one's helpers. A device runtime says what its preparations spent within:
//!   [`Phase::Translate`] (rewriting the model for its device; within it
//!   [`Phase::Convert`], [`Phase::Optimize`] and [`Phase::Fuse`]) and [`Phase::Build`]
//!   (the plan built: its memory schema, its constants on the device).
//!
//! The summary ([`Timeline::summary`]) sets the run's wall clock against the time some
//! batch was running (what a device did, at most) and the phases' sums: the gaps are what
//! pipelining or a cheaper host side would win.
//!
//! Recording is process-wide and off by default (when off, a phase costs two clock reads
//! and the totals' two atomic adds, below); [`record`] turns it on around a closure.
//! Settling changes when work is queued, not what it computes: results are the same with
//! recording on.
//!
//! Whether recording or not, each phase's time and count add up in process-wide
//! **totals** ([`totals`]): a server's metrics read them, so that where its runs' time
//! goes under load shows without a recording's settling changing it. Without settling,
//! a device's queued work shows in whichever phase waits for it (the download, the turn).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tract_core::internal::*;

/// A phase of a run (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Checking every sample against the model's input fact, before any batch.
    Check,
    /// Cutting the samples into batches (the scheduler's plan).
    Schedule,
    Upload,
    /// Within an upload: the samples copied into the packed batch's staging memory.
    Pack,
    /// Waiting for the lane's turn to run (module doc).
    Turn,
    Run,
    Download,
    /// Within a download: the samples' outputs cropped out of the batch's.
    Crop,
    /// Waiting, within any phase, while another thread holds the device alone (on
    /// ragged-cuda, a CUDA graph's capture, which no other run, upload or download may
    /// overlap): counted only where it waited.
    Hold,
    /// A plan prepared (module doc).
    Prepare,
    /// Within a preparation: a device runtime rewriting the model for its device.
    Translate,
    /// Within a translation: the ops converted to the device's (constants uploaded).
    Convert,
    /// Within a translation: the converted model optimized.
    Optimize,
    /// Within a translation: element-wise chains fused (kernels generated and loaded).
    Fuse,
    /// Within a preparation: a device runtime building the plan of the rewritten model
    /// (memory schema, constants uploaded).
    Build,
}

impl Phase {
    const ALL: [Phase; 15] = [
        Phase::Check,
        Phase::Schedule,
        Phase::Upload,
        Phase::Pack,
        Phase::Turn,
        Phase::Run,
        Phase::Download,
        Phase::Crop,
        Phase::Hold,
        Phase::Prepare,
        Phase::Translate,
        Phase::Convert,
        Phase::Optimize,
        Phase::Fuse,
        Phase::Build,
    ];

    /// Its name, as metrics label it: `upload`, `pack`.
    pub fn label(self) -> &'static str {
        self.name().trim_start()
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Check => "check",
            Phase::Schedule => "schedule",
            Phase::Upload => "upload",
            Phase::Pack => "  pack",
            Phase::Turn => "turn",
            Phase::Run => "run",
            Phase::Download => "download",
            Phase::Crop => "  crop",
            Phase::Hold => "hold",
            Phase::Prepare => "prepare",
            Phase::Translate => "  translate",
            Phase::Convert => "    convert",
            Phase::Optimize => "    optimize",
            Phase::Fuse => "    fuse",
            Phase::Build => "  build",
        }
    }

    /// Whether the phase is one of a batch's three (the others are the run's, or within
    /// one of the three).
    fn of_batch(self) -> bool {
        matches!(self, Phase::Upload | Phase::Run | Phase::Download)
    }
}

/// One phase of one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub phase: Phase,
    /// The thread that ran it (a lane's name, or the caller's).
    pub lane: String,
    pub samples: usize,
    /// The padded extents the batch ran at.
    pub extents: TVec<usize>,
    /// Since recording began.
    pub start: Duration,
    pub end: Duration,
}

/// Every span recorded by one [`record`].
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub spans: Vec<Span>,
    /// Wall clock of the recorded closure.
    pub wall: Duration,
}

static ON: AtomicBool = AtomicBool::new(false);
static SPANS: Mutex<Option<(Instant, Vec<Span>)>> = Mutex::new(None);

/// Each phase's nanoseconds and count since the process started, in [`Phase::ALL`]'s order.
static TOTALS: [(AtomicU64, AtomicU64); Phase::ALL.len()] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; Phase::ALL.len()];

/// Each phase's total time and count since the process started, on every thread,
/// recording or not (module doc).
pub fn totals() -> Vec<(Phase, Duration, u64)> {
    Phase::ALL
        .iter()
        .zip(&TOTALS)
        .map(|(phase, (nanos, count))| {
            (
                *phase,
                Duration::from_nanos(nanos.load(Ordering::Relaxed)),
                count.load(Ordering::Relaxed),
            )
        })
        .collect()
}

/// What the phases took between two readings of [`totals`], `before` then `after`.
pub fn difference(
    after: &[(Phase, Duration, u64)],
    before: &[(Phase, Duration, u64)],
) -> Vec<(Phase, Duration, u64)> {
    after
        .iter()
        .zip(before)
        .map(|((phase, took, n), (_, took_before, n_before))| {
            (
                *phase,
                took.saturating_sub(*took_before),
                n.saturating_sub(*n_before),
            )
        })
        .collect()
}

/// Whether a timeline is being recorded.
pub fn recording() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Runs `f` with recording on; returns its result and what was recorded. Recordings do
/// not nest: an inner one records nothing of its own and leaves the outer one running.
pub fn record<T>(f: impl FnOnce() -> T) -> (T, Timeline) {
    let start = Instant::now();
    let mine = {
        let Ok(mut spans) = SPANS.lock() else {
            return (f(), Timeline::default());
        };
        if spans.is_some() {
            false
        } else {
            *spans = Some((start, vec![]));
            ON.store(true, Ordering::Release);
            true
        }
    };
    let out = f();
    let wall = start.elapsed();
    if !mine {
        return (out, Timeline::default());
    }
    ON.store(false, Ordering::Release);
    let spans = SPANS
        .lock()
        .ok()
        .and_then(|mut s| s.take())
        .map(|(_, spans)| spans)
        .unwrap_or_default();
    (out, Timeline { spans, wall })
}

/// Runs `f` as phase `phase` of a batch of `samples` padded to `extents`: its time added
/// to the totals, and its span recorded when a timeline is being recorded.
pub fn phase<T>(phase: Phase, samples: usize, extents: &[usize], f: impl FnOnce() -> T) -> T {
    let begin = Instant::now();
    let out = f();
    let end = Instant::now();
    if let Some((nanos, count)) = Phase::ALL
        .iter()
        .position(|p| *p == phase)
        .and_then(|ix| TOTALS.get(ix))
    {
        let took =
            u64::try_from(end.saturating_duration_since(begin).as_nanos()).unwrap_or(u64::MAX);
        nanos.fetch_add(took, Ordering::Relaxed);
        count.fetch_add(1, Ordering::Relaxed);
    }
    if !recording() {
        return out;
    }
    if let Ok(mut spans) = SPANS.lock()
        && let Some((origin, spans)) = spans.as_mut()
    {
        let lane = std::thread::current()
            .name()
            .unwrap_or("caller")
            .to_string();
        spans.push(Span {
            phase,
            lane,
            samples,
            extents: extents.into(),
            start: begin.saturating_duration_since(*origin),
            end: end.saturating_duration_since(*origin),
        });
    }
    out
}

/// The total length of the union of `intervals`.
fn covered(mut intervals: Vec<(Duration, Duration)>) -> Duration {
    intervals.sort();
    let mut total = Duration::ZERO;
    let mut current: Option<(Duration, Duration)> = None;
    for (a, b) in intervals {
        match current {
            Some((s, e)) if a <= e => current = Some((s, e.max(b))),
            Some((s, e)) => {
                total += e - s;
                current = Some((a, b));
            }
            None => current = Some((a, b)),
        }
    }
    if let Some((s, e)) = current {
        total += e - s;
    }
    total
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Timeline {
    /// The time some span of `phase` was under way (their union, not their sum).
    pub fn covered(&self, phase: Phase) -> Duration {
        covered(
            self.spans
                .iter()
                .filter(|s| s.phase == phase)
                .map(|s| (s.start, s.end))
                .collect(),
        )
    }

    /// The sum of the spans of `phase`.
    pub fn sum(&self, phase: Phase) -> Duration {
        self.spans
            .iter()
            .filter(|s| s.phase == phase)
            .map(|s| s.end - s.start)
            .sum()
    }

    /// The batches that ran: one per [`Phase::Run`] span.
    pub fn batches(&self) -> usize {
        self.spans.iter().filter(|s| s.phase == Phase::Run).count()
    }

    /// A few lines for the user: the wall clock against what the phases covered, then
    /// each batch's phases in the order they started.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let lanes: std::collections::BTreeSet<&str> = self
            .spans
            .iter()
            .filter(|s| s.phase == Phase::Run)
            .map(|s| s.lane.as_str())
            .collect();
        let any = covered(
            self.spans
                .iter()
                .filter(|s| s.phase.of_batch())
                .map(|s| (s.start, s.end))
                .collect(),
        );
        out += &format!(
            "timeline: {} batches in {} lanes, wall clock {:.1} ms; some batch under way {:.1} ms, none {:.1} ms\n",
            self.batches(),
            lanes.len(),
            ms(self.wall),
            ms(any),
            ms(self.wall.saturating_sub(any)),
        );
        for phase in Phase::ALL {
            if !self.spans.iter().any(|s| s.phase == phase) {
                continue;
            }
            out += &format!(
                "  {:<11}  under way {:>7.1} ms of the wall clock, sum over batches {:>7.1} ms\n",
                phase.name(),
                ms(self.covered(phase)),
                ms(self.sum(phase)),
            );
        }
        // One row per batch: its run span, with its upload and download beside it.
        let mut runs: Vec<&Span> = self
            .spans
            .iter()
            .filter(|s| s.phase == Phase::Run)
            .collect();
        runs.sort_by_key(|s| s.start);
        out += "  batch  samples  padded      lane                        upload ms  turn ms  run ms  download ms  run starts at ms\n";
        for (ix, run) in runs.iter().enumerate() {
            // The same lane's spans of this batch: the last upload before the run, the first
            // download after it.
            let on_lane = |phase: Phase| {
                self.spans.iter().filter(move |s| {
                    s.phase == phase && s.lane == run.lane && s.extents == run.extents
                })
            };
            let upload = on_lane(Phase::Upload)
                .filter(|s| s.end <= run.start)
                .max_by_key(|s| s.end)
                .map(|s| ms(s.end - s.start));
            let turn = on_lane(Phase::Turn)
                .filter(|s| s.end <= run.start)
                .max_by_key(|s| s.end)
                .map(|s| ms(s.end - s.start));
            let download = on_lane(Phase::Download)
                .filter(|s| s.start >= run.end)
                .min_by_key(|s| s.start)
                .map(|s| ms(s.end - s.start));
            let extents = crate::spec::extents_string(&run.extents);
            out += &format!(
                "  {ix:>5}  {:>7}  {extents:<10}  {:<26}  {:>9}  {:>7}  {:>6.2}  {:>11}  {:>16.1}\n",
                run.samples,
                run.lane,
                upload.map_or("-".into(), |u| format!("{u:.2}")),
                turn.map_or("-".into(), |t| format!("{t:.2}")),
                ms(run.end - run.start),
                download.map_or("-".into(), |d| format!("{d:.2}")),
                ms(run.start),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_union_of_intervals_counts_overlaps_once() {
        let d = Duration::from_millis;
        assert_eq!(covered(vec![]), Duration::ZERO);
        assert_eq!(covered(vec![(d(0), d(10)), (d(5), d(15))]), d(15));
        assert_eq!(covered(vec![(d(20), d(30)), (d(0), d(10))]), d(20));
        assert_eq!(covered(vec![(d(0), d(30)), (d(5), d(10))]), d(30));
    }

    #[test]
    fn every_phase_adds_to_the_totals_recording_or_not() {
        let before = totals();
        phase(Phase::Crop, 1, &[8], || {
            std::thread::sleep(Duration::from_millis(2))
        });
        let ((), _) = record(|| {
            phase(Phase::Crop, 1, &[8], || {
                std::thread::sleep(Duration::from_millis(1))
            })
        });
        let after = totals();
        let crop = |t: &[(Phase, Duration, u64)]| {
            t.iter()
                .find(|(p, _, _)| *p == Phase::Crop)
                .map(|(_, d, n)| (*d, *n))
                .unwrap_or_default()
        };
        let ((d0, n0), (d1, n1)) = (crop(&before), crop(&after));
        // Other tests' batches may crop meanwhile: at least these two.
        assert!(n1 >= n0 + 2);
        assert!(d1 >= d0 + Duration::from_millis(3));
        assert_eq!(Phase::Crop.label(), "crop");
    }

    #[test]
    fn phases_are_recorded_only_inside_a_recording() {
        phase(Phase::Run, 1, &[8], || ());
        let ((), timeline) = record(|| {
            phase(Phase::Upload, 2, &[16], || ());
            phase(Phase::Turn, 2, &[16], || {
                std::thread::sleep(Duration::from_millis(1))
            });
            phase(Phase::Run, 2, &[16], || {
                std::thread::sleep(Duration::from_millis(2))
            });
        });
        // Other tests' batches may run meanwhile: only this test's spans count.
        let mine: Vec<&Span> = timeline
            .spans
            .iter()
            .filter(|s| s.samples == 2 && s.extents.as_slice() == [16])
            .collect();
        assert_eq!(mine.len(), 3);
        assert_eq!(mine[2].phase, Phase::Run);
        assert!(mine[2].end - mine[2].start >= Duration::from_millis(2));
        let summary = timeline.summary();
        assert!(summary.contains("batches in"));
        // The batch's row gives the wait for its turn beside its upload and run.
        let row = summary
            .lines()
            .find(|l| l.contains("timeline::tests"))
            .unwrap_or_default()
            .to_string();
        let turn: f64 = row
            .split_whitespace()
            .nth(5)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0);
        assert!(turn >= 1.0, "no turn wait in {row:?}");
    }
}
