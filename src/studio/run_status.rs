//! Where the training page's run stands (starting, running, paused, finished, failed), in a word for the page
//! and the top bar.

/// Where the current (or last) run stands.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStatus {
    Idle,
    /// Start was sent; waiting for `Started`.
    Starting,
    Running,
    Pausing,
    Paused,
    Stopping,
    Finished {
        stopped_early: bool,
    },
    Failed(String),
}

impl RunStatus {
    pub fn is_active(&self) -> bool {
        matches!(self, Self::Starting | Self::Running | Self::Pausing | Self::Paused | Self::Stopping)
    }

    pub fn label(&self) -> String {
        match self {
            Self::Idle => "idle".into(),
            Self::Starting => "starting…".into(),
            Self::Running => "training".into(),
            Self::Pausing => "pausing…".into(),
            Self::Paused => "paused".into(),
            Self::Stopping => "stopping…".into(),
            Self::Finished { stopped_early: true } => "stopped".into(),
            Self::Finished { stopped_early: false } => "finished".into(),
            Self::Failed(_) => "failed".into(),
        }
    }
}
