//! Shared pieces of the studio: number formatting, the colour palette, labelled setting rows with tooltips,
//! status banners, a progress bar with ETA, the trained/masked token view, and plot helpers.

use egui::text::LayoutJob;
use egui::{Color32, RichText, TextFormat, Ui};
use egui_plot::PlotPoint;

/// The studio's palette: one accent plus semantic colours that read on the dark and the light theme.
pub mod palette {
    use egui::Color32;
    pub const ACCENT: Color32 = Color32::from_rgb(0xF2, 0xA6, 0x3B);
    pub const TRAIN: Color32 = Color32::from_rgb(0x5B, 0x9B, 0xF0);
    pub const TRAIN_RAW: Color32 = Color32::from_rgba_premultiplied(0x3A, 0x5F, 0x92, 0x90);
    pub const VALID: Color32 = Color32::from_rgb(0xF2, 0xA6, 0x3B);
    pub const LR: Color32 = Color32::from_rgb(0xB0, 0x8C, 0xF0);
    pub const SPEED: Color32 = Color32::from_rgb(0x4F, 0xC3, 0x9A);
    pub const OK: Color32 = Color32::from_rgb(0x5C, 0xC8, 0x7A);
    pub const WARN: Color32 = Color32::from_rgb(0xE8, 0xB3, 0x3C);
    pub const ERROR: Color32 = Color32::from_rgb(0xF0, 0x6A, 0x6A);
    pub const TRAINED_BG: Color32 = Color32::from_rgb(0x1F, 0x4A, 0x33);
    pub const TRAINED_FG: Color32 = Color32::from_rgb(0xB8, 0xF0, 0xC8);
    pub const MASKED_FG: Color32 = Color32::from_rgb(0x8A, 0x8F, 0x98);
    /// The background of a search match in row text.
    pub const SEARCH_MATCH: Color32 = Color32::from_rgb(0xF5, 0xD0, 0x4C);
    /// Distinct colours for overlaid runs.
    pub const SERIES: [Color32; 8] = [
        Color32::from_rgb(0x5B, 0x9B, 0xF0),
        Color32::from_rgb(0xF2, 0xA6, 0x3B),
        Color32::from_rgb(0x4F, 0xC3, 0x9A),
        Color32::from_rgb(0xE0, 0x6C, 0x9F),
        Color32::from_rgb(0xB0, 0x8C, 0xF0),
        Color32::from_rgb(0xD9, 0xD2, 0x5B),
        Color32::from_rgb(0x6C, 0xD4, 0xE0),
        Color32::from_rgb(0xF0, 0x6A, 0x6A),
    ];
}

/// 1234567 -> "1,234,567": exact counts (row numbers) grouped by thousands.
pub fn fmt_thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// 134_515_008 -> "134.5 M".
pub fn fmt_count(n: usize) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1} M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1} k", x / 1e3)
    } else {
        n.to_string()
    }
}

/// Bytes in binary units: "1.26 GiB".
pub fn fmt_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    const K: f64 = 1024.0;
    if b >= K * K * K {
        format!("{:.2} GiB", b / (K * K * K))
    } else if b >= K * K {
        format!("{:.1} MiB", b / (K * K))
    } else if b >= K {
        format!("{:.1} KiB", b / K)
    } else {
        format!("{bytes} B")
    }
}

/// Seconds as "1h 02m", "3m 05s" or "12.3 s".
pub fn fmt_secs(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "–".into();
    }
    let s = secs.round() as u64;
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{secs:.1} s")
    }
}

/// A learning rate or other small number in compact scientific notation: "2e-4", "1.5e-5".
pub fn fmt_sci(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let s = format!("{x:.1e}");
    s.replace(".0e", "e")
}

/// A loss value.
pub fn fmt_loss(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "–".into()
    }
}

/// Seconds since the Unix epoch as local-ish "YYYY-MM-DD HH:MM" (UTC; no time-zone database needed).
pub fn fmt_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}

/// "3 min ago" style age of a Unix timestamp.
pub fn fmt_age(secs: u64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(secs);
    let age = now.saturating_sub(secs);
    if age < 60 {
        "just now".into()
    } else if age < 3600 {
        format!("{} min ago", age / 60)
    } else if age < 86_400 {
        format!("{} h ago", age / 3600)
    } else {
        fmt_unix(secs)
    }
}

/// A small filled circle: a status light.
pub fn status_dot_ui(ui: &mut Ui, color: Color32) -> egui::Response {
    let size = ui.text_style_height(&egui::TextStyle::Body);
    let (rect, response) = ui.allocate_exact_size(egui::vec2(size * 0.8, size), egui::Sense::hover());
    ui.painter().circle_filled(rect.center(), size * 0.3, color);
    response
}

/// A section heading with a little space above.
pub fn section_ui(ui: &mut Ui, title: &str) {
    ui.add_space(6.0);
    ui.label(RichText::new(title).strong().size(15.0));
    ui.add_space(2.0);
}

/// The page title and a one-line explanation under it.
pub fn page_header_ui(ui: &mut Ui, title: &str, subtitle: &str) {
    ui.label(RichText::new(title).size(22.0).strong());
    ui.label(RichText::new(subtitle).weak());
    ui.add_space(6.0);
    ui.separator();
}

/// A label whose hover text explains the setting; returns its response so inputs can be `labelled_by` it.
pub fn setting_label_ui(ui: &mut Ui, text: &str, help: &str) -> egui::Response {
    ui.label(text).on_hover_text(help)
}

/// Kinds of banner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Info,
    Ok,
    Warn,
    Error,
}

impl Tone {
    pub fn color(self) -> Color32 {
        match self {
            Tone::Info => palette::TRAIN,
            Tone::Ok => palette::OK,
            Tone::Warn => palette::WARN,
            Tone::Error => palette::ERROR,
        }
    }
}

/// A framed message with a coloured edge: errors, warnings, hints.
pub fn banner_ui(ui: &mut Ui, tone: Tone, text: impl Into<String>) -> egui::Response {
    let color = tone.color();
    egui::Frame::new()
        .fill(color.gamma_multiply(0.12))
        .stroke(egui::Stroke::new(1.0, color.gamma_multiply(0.7)))
        .corner_radius(4.0)
        .inner_margin(egui::Margin::symmetric(10, 6))
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.add(egui::Label::new(RichText::new(text.into()).color(color)).wrap().selectable(true));
        })
        .response
}

/// A card: a softly filled frame grouping related content.
pub fn card_ui<R>(ui: &mut Ui, add_contents: impl FnOnce(&mut Ui) -> R) -> R {
    egui::Frame::group(ui.style())
        .fill(ui.visuals().faint_bg_color)
        .corner_radius(6.0)
        .inner_margin(egui::Margin::same(10))
        .show(ui, add_contents)
        .inner
}

/// Progress of a run: a bar with "step / total · percent" and a line with elapsed time, ETA and speed.
pub fn run_progress_ui(
    ui: &mut Ui,
    step: usize,
    total: usize,
    elapsed_secs: f64,
    eta_secs: Option<f64>,
    tokens_per_sec: Option<f64>,
) {
    let fraction = if total > 0 { (step as f32 / total as f32).clamp(0.0, 1.0) } else { 0.0 };
    ui.add(
        egui::ProgressBar::new(fraction)
            .fill(palette::ACCENT.gamma_multiply(0.85))
            .desired_height(18.0)
            .text(RichText::new(format!("step {step} / {total}  ·  {:.0}%", fraction * 100.0)).strong()),
    );
    ui.horizontal(|ui| {
        ui.label(format!("elapsed {}", fmt_secs(elapsed_secs)));
        ui.separator();
        ui.label(match eta_secs {
            Some(eta) if step < total => format!("ETA {}", fmt_secs(eta)),
            _ => "ETA –".into(),
        });
        if let Some(tps) = tokens_per_sec {
            ui.separator();
            ui.label(format!("{tps:.0} tokens/s"));
        }
    });
}

/// Render token pieces, trained ones highlighted and masked ones dimmed, wrapped to the available width; matches
/// of `highlight` (a search) marked.
pub fn token_view_ui(ui: &mut Ui, pieces: &[(String, bool)], highlight: &str) {
    let font = egui::FontId::monospace(12.5);
    let trained = TextFormat {
        font_id: font.clone(),
        color: palette::TRAINED_FG,
        background: palette::TRAINED_BG,
        ..Default::default()
    };
    let masked = TextFormat { font_id: font, color: palette::MASKED_FG, ..Default::default() };
    let sections: Vec<(&str, &TextFormat)> = pieces
        .iter()
        .map(|(piece, is_trained)| (piece.as_str(), if *is_trained { &trained } else { &masked }))
        .collect();
    let job = highlighted_job(&sections, highlight, ui.available_width());
    ui.add(egui::Label::new(job).wrap().selectable(true));
}

/// Text laid out in sections of their own formats, with every match of `highlight` (the dataset search's rule,
/// [`crate::engine::data::match_ranges`]) marked in the search colour, across section boundaries too.
pub fn highlighted_job(sections: &[(&str, &TextFormat)], highlight: &str, wrap_width: f32) -> LayoutJob {
    let mut job = LayoutJob::default();
    job.wrap.max_width = wrap_width;
    let full: String = sections.iter().map(|(text, _)| *text).collect();
    let matches = crate::engine::data::match_ranges(&full, highlight);
    let mut offset = 0;
    for (text, format) in sections {
        let end = offset + text.len();
        let mut at = offset;
        // The matches overlapping this section, cut to it.
        for m in matches.iter().filter(|m| m.start < end && m.end > offset) {
            let (from, to) = (m.start.max(offset), m.end.min(end));
            if from > at {
                job.append(&full[at..from], 0.0, (*format).clone());
            }
            let marked = TextFormat { color: Color32::BLACK, background: palette::SEARCH_MATCH, ..(*format).clone() };
            job.append(&full[from..to], 0.0, marked);
            at = to;
        }
        if at < end {
            job.append(&full[at..end], 0.0, (*format).clone());
        }
        offset = end;
    }
    job
}

/// The legend of [`token_view_ui`].
pub fn token_legend_ui(ui: &mut Ui) {
    ui.horizontal(|ui| {
        ui.label(
            RichText::new(" trained ").monospace().color(palette::TRAINED_FG).background_color(palette::TRAINED_BG),
        )
        .on_hover_text("Tokens the loss is computed on: the assistant replies and their end-of-turn token.");
        ui.label(RichText::new(" masked ").monospace().color(palette::MASKED_FG)).on_hover_text(
            "Tokens the model sees as context but is not trained to produce: system and user turns, template markup.",
        );
    });
}

/// Exponential moving average with TensorBoard's debiasing, so early points are not pulled towards zero.
#[derive(Debug, Clone, Default)]
pub struct Ema {
    value: f64,
    weight: f64,
}

impl Ema {
    pub fn push(&mut self, x: f64, smoothing: f64) -> f64 {
        if !x.is_finite() {
            return self.get();
        }
        self.value = smoothing * self.value + (1.0 - smoothing) * x;
        self.weight = smoothing * self.weight + (1.0 - smoothing);
        self.get()
    }

    pub fn get(&self) -> f64 {
        if self.weight > 0.0 {
            self.value / self.weight
        } else {
            f64::NAN
        }
    }
}

/// The debiased EMA of a whole series.
pub fn smooth(points: &[PlotPoint], smoothing: f64) -> Vec<PlotPoint> {
    let mut ema = Ema::default();
    points.iter().map(|p| PlotPoint::new(p.x, ema.push(p.y, smoothing))).collect()
}

/// At most about `max_points` points of a long series, keeping each bucket's min and max so spikes stay
/// visible; short series are borrowed untouched.
pub fn decimate(points: &[PlotPoint], max_points: usize) -> std::borrow::Cow<'_, [PlotPoint]> {
    if points.len() <= max_points || max_points < 4 {
        return std::borrow::Cow::Borrowed(points);
    }
    let buckets = max_points / 2;
    let size = points.len().div_ceil(buckets);
    let mut out = Vec::with_capacity(buckets * 2 + 1);
    for chunk in points.chunks(size) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if p.y < chunk[lo].y {
                lo = i;
            }
            if p.y > chunk[hi].y {
                hi = i;
            }
        }
        let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        out.push(chunk[a]);
        if b != a {
            out.push(chunk[b]);
        }
    }
    if let (Some(last), Some(kept)) = (points.last(), out.last()) {
        if kept.x != last.x {
            out.push(*last);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Points from `[x, y]` pairs.
pub fn to_points(pairs: &[[f64; 2]]) -> Vec<PlotPoint> {
    pairs.iter().map(|p| PlotPoint::new(p[0], p[1])).collect()
}

/// A compact y-axis label formatter for plots whose values span orders of magnitude.
pub fn axis_sci(mark: egui_plot::GridMark, _range: &std::ops::RangeInclusive<f64>) -> String {
    let v = mark.value;
    if v == 0.0 {
        "0".into()
    } else if v.abs() < 1e-2 || v.abs() >= 1e5 {
        fmt_sci(v)
    } else {
        egui_plot::format_number(v, 4)
    }
}

/// "Recent:" followed by one small button per path (at most six); returns the path clicked this frame.
pub fn recent_paths_ui(
    ui: &mut Ui,
    paths: &[std::path::PathBuf],
    label: impl Fn(&std::path::Path) -> String,
) -> Option<std::path::PathBuf> {
    let mut clicked = None;
    ui.horizontal_wrapped(|ui| {
        ui.label(egui::RichText::new("Recent:").weak());
        for p in paths.iter().take(6) {
            if ui.small_button(label(p)).on_hover_text(p.display().to_string()).clicked() {
                clicked = Some(p.clone());
            }
        }
    });
    clicked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_naturally() {
        assert_eq!(fmt_count(134_515_008), "134.5 M");
        assert_eq!(fmt_count(812), "812");
        assert_eq!(fmt_thousands(100_000), "100,000");
        assert_eq!(fmt_thousands(1_234_567), "1,234,567");
        assert_eq!(fmt_thousands(999), "999");
        assert_eq!(fmt_bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(fmt_secs(75.0), "1m 15s");
        assert_eq!(fmt_secs(3725.0), "1h 02m");
        assert_eq!(fmt_sci(2e-4), "2e-4");
        assert_eq!(fmt_sci(1.5e-5), "1.5e-5");
        assert_eq!(fmt_unix(0), "1970-01-01 00:00 UTC");
        assert_eq!(fmt_unix(1_700_000_000), "2023-11-14 22:13 UTC");
    }

    #[test]
    fn ema_is_debiased() {
        let mut e = Ema::default();
        assert_eq!(e.push(2.0, 0.9), 2.0);
        assert!((e.push(2.0, 0.9) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn decimation_keeps_extremes_and_the_last_point() {
        let pts: Vec<PlotPoint> =
            (0..10_000).map(|i| PlotPoint::new(i as f64, if i == 5000 { 100.0 } else { 1.0 })).collect();
        let d = decimate(&pts, 500);
        assert!(d.len() <= 502, "{}", d.len());
        assert!(d.iter().any(|p| p.y == 100.0));
        assert_eq!(d.last().map(|p| p.x), Some(9999.0));
    }
}
