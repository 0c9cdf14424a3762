//! The harness of the core's integration tests (`core/tests/core`): the
//! core's model and journal-recording helpers.
//!
//! - [`generations`], [`page_model`], [`recorder`].

#![allow(dead_code)]

pub mod generations;
pub mod page_model;
pub mod recorder;
