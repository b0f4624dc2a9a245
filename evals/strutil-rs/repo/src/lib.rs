//! String utilities: see SPEC.md.
