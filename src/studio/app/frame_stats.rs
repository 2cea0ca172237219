//! Frame-time bookkeeping for `--measure-frames` and the status bar, and the app's recording of it.

use super::StudioApp;
use crate::worker::Command;
use std::time::Instant;

/// Frame-time bookkeeping: the studio's own UI time per frame, eframe's CPU time per frame, and how long
/// draining the worker took.
#[derive(Debug, Default, Clone)]
pub struct FrameStats {
    pub ui_ms: Vec<f32>,
    pub cpu_ms: Vec<f32>,
    pub drain_ms: Vec<f32>,
    pub events: usize,
    pub max_events_per_frame: usize,
    pub max_pending: usize,
    pub recording_since: Option<Instant>,
    pub steps_at_start: usize,
    pub last_ui_ms: f32,
}

impl FrameStats {
    pub(super) fn record(&mut self, ui_ms: f32, drain_ms: f32, events: usize, pending: usize) {
        self.last_ui_ms = ui_ms;
        if self.recording_since.is_none() {
            return;
        }
        self.ui_ms.push(ui_ms);
        self.drain_ms.push(drain_ms);
        self.events += events;
        self.max_events_per_frame = self.max_events_per_frame.max(events);
        self.max_pending = self.max_pending.max(pending);
    }

    /// A JSON summary with percentiles.
    pub fn report(&self, steps: usize) -> serde_json::Value {
        let pct = |v: &[f32], p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let mut s = v.to_vec();
            s.sort_by(|a, b| a.total_cmp(b));
            s[((s.len() - 1) as f64 * p).round() as usize] as f64
        };
        let secs = self.recording_since.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
        let summary = |v: &[f32]| {
            serde_json::json!({
                "p50_ms": pct(v, 0.5), "p95_ms": pct(v, 0.95), "p99_ms": pct(v, 0.99), "max_ms": pct(v, 1.0),
                "mean_ms": if v.is_empty() { 0.0 } else { v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64 },
            })
        };
        let mut report = serde_json::json!({
            "seconds": secs,
            "frames": self.ui_ms.len(),
            "frames_per_sec": self.ui_ms.len() as f64 / secs.max(1e-9),
            "ui_build": summary(&self.ui_ms),
            "event_drain": summary(&self.drain_ms),
            "events_drained": self.events,
            "max_events_per_frame": self.max_events_per_frame,
            "max_events_waiting": self.max_pending,
            "train_steps_received": steps.saturating_sub(self.steps_at_start),
        });
        // eframe reports its own CPU time per frame (UI + tessellation); a headless harness has none.
        if !self.cpu_ms.is_empty() {
            report["eframe_cpu"] = summary(&self.cpu_ms);
        }
        report
    }
}

impl StudioApp {
    /// Start and finish the `--measure-frames` recording.
    pub(super) fn measurement_tick(&mut self, ctx: &egui::Context) {
        let Some(secs) = self.options.measure_frames_secs else { return };
        if self.measurement_done {
            return;
        }
        ctx.request_repaint();
        match self.frames.recording_since {
            None if self.training_panel.steps_received > 0 => {
                self.frames.recording_since = Some(Instant::now());
                self.frames.steps_at_start = self.training_panel.steps_received;
            }
            Some(t) if t.elapsed().as_secs_f64() >= secs => {
                self.measurement_done = true;
                let mut report = self.frames.report(self.training_panel.steps_received);
                if let Some(m) = &self.model.loaded {
                    report["model"] = serde_json::json!(m.name());
                    report["device"] = serde_json::json!(m.device);
                }
                report["training_status"] = serde_json::json!(self.training_panel.status.label());
                let text = serde_json::to_string_pretty(&report).unwrap_or_default();
                match &self.options.measure_out {
                    Some(p) => {
                        if let Err(e) = std::fs::write(p, &text) {
                            eprintln!("cannot write {}: {e}", p.display());
                        }
                    }
                    None => println!("{text}"),
                }
                self.worker.send(Command::StopTraining);
                super::close_without_asking(ctx);
            }
            _ => {}
        }
    }

    /// eframe's measure of the previous frame's CPU time (UI plus tessellation), for the frame report.
    pub fn record_cpu_usage(&mut self, cpu_secs: Option<f32>) {
        if let (Some(s), Some(_)) = (cpu_secs, self.frames.recording_since) {
            self.frames.cpu_ms.push(s * 1e3);
        }
    }
}
