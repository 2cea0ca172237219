//! The studio.
