//! The Help window behind the top bar's Help button: a quick start (load a model, pick data, choose settings,
//! train, test, export, each step with a button to its page), the glossary of the settings (the same text as
//! their hover texts, from `studio::glossary`), the keyboard and mouse shortcuts, where the README says more,
//! and the system report (`metal-candle doctor`'s text, gathered by the worker when first shown) with Copy.

use crate::studio::app::Page;
use crate::studio::glossary;
use crate::studio::widgets::palette;
use egui::{RichText, Ui};

/// The Help window's tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HelpTab {
    #[default]
    QuickStart,
    Glossary,
    Shortcuts,
    SystemReport,
}

impl HelpTab {
    const ALL: [HelpTab; 4] = [Self::QuickStart, Self::Glossary, Self::Shortcuts, Self::SystemReport];

    fn title(self) -> &'static str {
        match self {
            Self::QuickStart => "Quick start",
            Self::Glossary => "Glossary",
            Self::Shortcuts => "Shortcuts",
            Self::SystemReport => "System report",
        }
    }
}

/// The Help window's state.
#[derive(Default)]
pub struct HelpWindow {
    open: bool,
    tab: HelpTab,
    /// The system report once the worker sent it.
    report: Option<String>,
    /// Whether the report has been asked for (and not yet answered).
    report_requested: bool,
}

/// What the Help window asks the app for this frame.
#[derive(Default)]
pub struct HelpClicks {
    /// Show this page (a quick-start step's button).
    pub goto: Option<Page>,
    /// Gather the system report (the first time its tab is shown, or Refresh).
    pub diagnose: bool,
}

/// A quick-start step: what to do, and on which page.
struct Step {
    title: &'static str,
    text: &'static str,
    page: Page,
}

const STEPS: [Step; 6] = [
    Step {
        title: "Load a base model",
        text: "Type the path of a Hugging Face model folder or a .gguf file and press Load model, pick one of the \
               models found on this machine, drop one onto the window, or search Hugging Face and download one. \
               The model card shows its family and size and what training will cost.",
        page: Page::Model,
    },
    Step {
        title: "Pick your data",
        text: "Open a .jsonl, .json or .parquet file, or a folder with train.jsonl (and valid.jsonl). Rows can be \
               chat messages, ShareGPT, Alpaca, prompt/completion or plain text: the report shows the format it \
               detected, rows per split, token lengths, and any bad row with its line number.",
        page: Page::Dataset,
    },
    Step {
        title: "Choose the settings",
        text: "The defaults (rank 8, alpha 16, q_proj and v_proj, learning rate 2e-4, 100 steps) make a sensible \
               first run. The cost card shows trainable parameters and memory as you change them; the Glossary tab \
               explains every setting.",
        page: Page::Settings,
    },
    Step {
        title: "Train",
        text: "Press Start training and watch the loss, learning rate and tokens/s. Pause and resume at will; Stop \
               saves a last checkpoint. A checkpoint is written every \"Save every\" steps.",
        page: Page::Training,
    },
    Step {
        title: "Test what it learned",
        text: "On the Checkpoints page pick a run and press Open in chat on a checkpoint. In Chat, \"Side by side\" \
               answers each prompt with the base model and with your adapter.",
        page: Page::Checkpoints,
    },
    Step {
        title: "Export",
        text: "Export… on a checkpoint writes a PEFT or mlx-lm adapter, a merged model folder, one GGUF file for \
               llama.cpp, Ollama or LM Studio, a llama.cpp LoRA GGUF, or an Ollama folder.",
        page: Page::Checkpoints,
    },
];

/// (keys, what they do); each is handled in the studio or by egui itself.
const SHORTCUTS: [(&str, &str); 8] = [
    ("Enter", "In the model path, dataset path or Hugging Face search field: load, open or search."),
    ("Enter", "In the chat box: send the message."),
    ("Shift + Enter", "In the chat box: a new line."),
    ("Enter / Escape", "While renaming a run: save the name / cancel."),
    ("Ctrl + plus / minus / 0", "Zoom the whole window in / out / back to 100% (Cmd on a Mac)."),
    ("Drag / Ctrl + scroll", "On a plot: pan / zoom; right-drag zooms to a box."),
    ("Double-click", "On a plot: back to the whole curve."),
    ("Drop a file or folder", "A model (.gguf or folder) or a dataset (.jsonl, .json, .parquet or folder) opens."),
];

/// README sections worth reading next.
const README_SECTIONS: [(&str, &str); 5] = [
    ("Two commands", "start the studio with a real small model and sample data; run the tests"),
    ("Models and datasets from the Hugging Face Hub", "repo ids, downloads, tokens, the shared cache"),
    ("The command line", "every studio action as a CLI subcommand, QLoRA (--quantize)"),
    ("What it reads and writes", "model families, dataset formats, run folders, exports"),
    ("Reliability", "what survives a crash, a full disk or a killed process"),
];

impl HelpWindow {
    /// Open the window (on the tab last shown; the quick start the first time).
    pub fn show(&mut self) {
        self.open = true;
    }

    /// The worker's system report arrived.
    pub fn on_report(&mut self, text: String) {
        self.report = Some(text);
        self.report_requested = false;
    }

    pub fn ui(&mut self, ctx: &egui::Context) -> HelpClicks {
        let mut clicks = HelpClicks::default();
        let mut open = self.open;
        // Right of the navigation, so the pages the quick start names stay in view.
        let top_center = egui::pos2(ctx.content_rect().center().x + 90.0, 56.0);
        egui::Window::new("metal-candle help")
            .open(&mut open)
            .pivot(egui::Align2::CENTER_TOP)
            .default_pos(top_center)
            .default_width(780.0)
            .default_height(560.0)
            .resizable(true)
            .collapsible(false)
            .show(ctx, |ui| {
                ui.horizontal(|ui| {
                    for tab in HelpTab::ALL {
                        ui.selectable_value(&mut self.tab, tab, RichText::new(tab.title()).size(15.0));
                    }
                });
                ui.separator();
                if self.tab == HelpTab::SystemReport && self.report.is_none() && !self.report_requested {
                    self.report_requested = true;
                    clicks.diagnose = true;
                }
                if self.tab == HelpTab::SystemReport {
                    clicks.diagnose |= self.report_ui(ui);
                    return;
                }
                egui::ScrollArea::vertical().id_salt("help-scroll").auto_shrink([false, true]).show(ui, |ui| {
                    match self.tab {
                        HelpTab::QuickStart => clicks.goto = quick_start_ui(ui),
                        HelpTab::Glossary => glossary_ui(ui),
                        HelpTab::Shortcuts => shortcuts_ui(ui),
                        // Drawn above, in a scroll area of its own that also scrolls sideways.
                        HelpTab::SystemReport => {}
                    }
                });
            });
        self.open = open;
        clicks
    }

    /// The report with Copy and Refresh; returns whether Refresh was pressed.
    fn report_ui(&mut self, ui: &mut Ui) -> bool {
        ui.add(egui::Label::new(
            "What to paste into a bug report: build, OS, devices and dtypes, memory, the matrix library and which \
             kernel each op uses (the same as `metal-candle doctor`).",
        ));
        let mut refresh = false;
        ui.horizontal(|ui| {
            if let Some(text) = &self.report {
                if ui.button("Copy").on_hover_text("Copy the whole report to the clipboard").clicked() {
                    ui.ctx().copy_text(text.clone());
                }
            }
            if ui
                .add_enabled(!self.report_requested, egui::Button::new("Refresh"))
                .on_hover_text("Gather the report again")
                .clicked()
            {
                self.report_requested = true;
                refresh = true;
            }
            if self.report_requested {
                ui.spinner();
                ui.label(RichText::new("gathering…").weak());
            }
        });
        if let Some(text) = &self.report {
            // Its columns line up only unwrapped: scroll both ways instead.
            egui::ScrollArea::both().id_salt("report-scroll").auto_shrink([false, true]).show(ui, |ui| {
                ui.add(egui::Label::new(RichText::new(text).monospace()).extend());
            });
        }
        refresh
    }
}

/// The six steps, each with a button to its page; returns the page clicked.
fn quick_start_ui(ui: &mut Ui) -> Option<Page> {
    let mut goto = None;
    ui.label("From a model to an exported adapter in six steps. The pages are in the navigation on the left.");
    ui.add_space(6.0);
    for (i, step) in STEPS.iter().enumerate() {
        ui.horizontal_top(|ui| {
            ui.label(RichText::new(format!("{}", i + 1)).size(20.0).strong().color(palette::ACCENT));
            ui.vertical(|ui| {
                ui.label(RichText::new(step.title).strong().size(15.0));
                ui.add(egui::Label::new(step.text).wrap());
                let button = ui.small_button(format!("Go to {}", step.page.title()));
                if button.on_hover_text(format!("Show the {} page", step.page.title())).clicked() {
                    goto = Some(step.page);
                }
            });
        });
        ui.add_space(8.0);
    }
    ui.label(
        RichText::new(
            "Not sure which rank to use? The Rank explorer trains short probes at several ranks on the same budget and \
             plots what each costs in speed and memory and buys in validation loss.",
        )
        .weak(),
    );
    ui.add_space(8.0);
    ui.label(RichText::new("More in the README").strong());
    for (section, about) in README_SECTIONS {
        ui.label(format!("• \"{section}\": {about}"));
    }
    goto
}

/// Every setting's meaning and typical values.
fn glossary_ui(ui: &mut Ui) {
    ui.label("What each setting does. The same text appears when you hover the setting itself.");
    ui.add_space(6.0);
    let width = ui.available_width();
    egui::Grid::new("glossary").num_columns(2).spacing([16.0, 10.0]).striped(true).max_col_width(width).show(
        ui,
        |ui| {
            for term in glossary::ALL {
                ui.vertical(|ui| {
                    ui.set_min_width(130.0);
                    ui.label(RichText::new(term.name).strong());
                    ui.label(RichText::new(format!("{} page", term.page)).weak().small());
                });
                ui.vertical(|ui| {
                    ui.add(egui::Label::new(term.meaning).wrap());
                    ui.add(egui::Label::new(RichText::new(format!("Typical: {}", term.typical)).weak()).wrap());
                });
                ui.end_row();
            }
        },
    );
}

fn shortcuts_ui(ui: &mut Ui) {
    let width = ui.available_width();
    egui::Grid::new("shortcuts").num_columns(2).spacing([16.0, 6.0]).striped(true).max_col_width(width).show(
        ui,
        |ui| {
            for (keys, what) in SHORTCUTS {
                ui.label(RichText::new(keys).monospace().strong());
                ui.label(what);
                ui.end_row();
            }
        },
    );
}
