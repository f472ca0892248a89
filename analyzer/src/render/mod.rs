//! The report, rendered: plain text for terminals ([`text`]), one self-contained HTML page
//! ([`html`], its style and script in `assets/`), and a Perfetto / Chrome trace
//! ([`perfetto`]). Renderers read a finished [`crate::Report`] and nothing else; JSON is
//! the report itself, serialised.

pub mod html;
pub mod perfetto;
pub mod text;
