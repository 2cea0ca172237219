//! The training page's event log: the last [`LOG_LINES`] lines of a run (starts, steps, evaluations, saves,
//! pauses, failures), each stamped with the run's training time, drawn in a fixed-height box that follows the
//! newest line.

use super::widgets::{self, Tone};
use egui::{RichText, Ui};
use std::collections::VecDeque;

/// Lines the event log keeps.
const LOG_LINES: usize = 3000;

/// One log line: the run's training time when it was logged, the text, and how it should look.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub at_secs: f64,
    pub text: String,
    pub tone: Tone,
}

/// The lines, oldest first.
#[derive(Debug, Default)]
pub struct EventLog {
    lines: VecDeque<LogLine>,
}

impl EventLog {
    /// Add a line stamped `at_secs`, dropping the oldest past [`LOG_LINES`].
    pub fn push(&mut self, at_secs: f64, tone: Tone, text: String) {
        if self.lines.len() >= LOG_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(LogLine { at_secs, text, tone });
    }

    pub fn iter(&self) -> impl Iterator<Item = &LogLine> {
        self.lines.iter()
    }

    pub fn ui(&self, ui: &mut Ui) {
        widgets::section_ui(ui, "Event log");
        egui::Frame::new()
            .fill(ui.visuals().extreme_bg_color)
            .corner_radius(4.0)
            .inner_margin(egui::Margin::same(6))
            .show(ui, |ui| {
                let row_height = ui.text_style_height(&egui::TextStyle::Monospace);
                egui::ScrollArea::vertical()
                    .id_salt("train-log")
                    .min_scrolled_height(200.0)
                    .max_height(200.0)
                    .stick_to_bottom(true)
                    .auto_shrink([false, false])
                    .show_rows(ui, row_height, self.lines.len().max(1), |ui, range| {
                        if self.lines.is_empty() {
                            ui.label(
                                RichText::new("The run's events appear here, stamped with its training time.").weak(),
                            );
                            return;
                        }
                        let range = range.start.min(self.lines.len())..range.end.min(self.lines.len());
                        for line in self.lines.range(range) {
                            let color = match line.tone {
                                Tone::Info => ui.visuals().text_color(),
                                t => t.color(),
                            };
                            let text = format!("[{}] {}", fmt_clock(line.at_secs), line.text);
                            ui.label(RichText::new(text).monospace().color(color));
                        }
                    });
            });
    }
}

fn fmt_clock(secs: f64) -> String {
    let s = secs as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
}
