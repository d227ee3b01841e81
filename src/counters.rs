//! Process-wide counts of what a runtime does out of its callers' sight: a device's graph
//! captures, replays, evictions and plain runs, the plan states and convolution
//! descriptors it makes.
//!
//! A server's throughput can hang on them (a capture holds the device's other threads
//! back while it records; an eviction frees page-locked memory, which waits for the whole
//! device), and nothing in a run's outputs shows them. Runtimes count here as they go;
//! the server's metrics export the totals (`tract_ragged_runtime_events_total{event}`).
//! Counting is a relaxed atomic add; the counts are the process's, every runnable's.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a runtime counts (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A batch shape recorded as a graph.
    GraphCapture,
    /// A recording that failed (the batch ran plain).
    GraphCaptureFailed,
    /// A recording put off because other runs were under way (the batch ran plain).
    GraphCaptureDeferred,
    /// A run replayed from a graph.
    GraphReplay,
    /// A graph dropped to make room for another.
    GraphEviction,
    /// A run launched op by op (no graph).
    PlainRun,
    /// A plan's state made for a thread (its op states made again at its next runs).
    PlanState,
    /// A convolution's device descriptors made for an input shape it had not kept.
    ConvDescriptors,
}

impl Event {
    /// Every event, in the order [`totals`] gives them.
    pub const ALL: [Event; 8] = [
        Event::GraphCapture,
        Event::GraphCaptureFailed,
        Event::GraphCaptureDeferred,
        Event::GraphReplay,
        Event::GraphEviction,
        Event::PlainRun,
        Event::PlanState,
        Event::ConvDescriptors,
    ];

    /// Its name, as metrics label it.
    pub fn label(self) -> &'static str {
        match self {
            Event::GraphCapture => "graph_capture",
            Event::GraphCaptureFailed => "graph_capture_failed",
            Event::GraphCaptureDeferred => "graph_capture_deferred",
            Event::GraphReplay => "graph_replay",
            Event::GraphEviction => "graph_eviction",
            Event::PlainRun => "plain_run",
            Event::PlanState => "plan_state",
            Event::ConvDescriptors => "conv_descriptors",
        }
    }
}

static COUNTS: [AtomicU64; Event::ALL.len()] = [const { AtomicU64::new(0) }; Event::ALL.len()];

/// Counts one `event`.
pub fn count(event: Event) {
    if let Some(c) = Event::ALL
        .iter()
        .position(|e| *e == event)
        .and_then(|ix| COUNTS.get(ix))
    {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Each event's count since the process started.
pub fn totals() -> Vec<(Event, u64)> {
    Event::ALL
        .iter()
        .zip(&COUNTS)
        .map(|(e, c)| (*e, c.load(Ordering::Relaxed)))
        .collect()
}

/// The events counted between two readings of [`totals`], `before` then `after`.
pub fn difference(after: &[(Event, u64)], before: &[(Event, u64)]) -> Vec<(Event, u64)> {
    after
        .iter()
        .zip(before)
        .map(|((event, n), (_, n_before))| (*event, n.saturating_sub(*n_before)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_event() {
        let of = |t: &[(Event, u64)], e: Event| {
            t.iter()
                .find(|(x, _)| *x == e)
                .map(|(_, n)| *n)
                .unwrap_or(0)
        };
        let before = totals();
        count(Event::GraphEviction);
        count(Event::GraphEviction);
        let after = totals();
        // Other tests' runs may count meanwhile: at least these two.
        assert!(of(&after, Event::GraphEviction) >= of(&before, Event::GraphEviction) + 2);
        let since = difference(&after, &before);
        assert!(of(&since, Event::GraphEviction) >= 2);
        assert_eq!(
            of(&since, Event::GraphEviction),
            of(&after, Event::GraphEviction) - of(&before, Event::GraphEviction)
        );
        assert_eq!(Event::GraphEviction.label(), "graph_eviction");
    }
}
