//! The status page on the admin listener: `GET /` serves one self-contained HTML file (styles and
//! script inline, no external asset, so it works air-gapped) that refreshes itself from the admin
//! API every 2 s; and `GET /api/v1/events`, the recent history it shows ([`crate::ops::events`]).
//!
//! The page holds no data, so it is served without the token; the data routes keep the API's auth.
//! With a token configured, the page asks for it, keeps it in `sessionStorage` only, and sends it as
//! `Authorization: Bearer`. Headers forbid framing (the page has action buttons) and any fetch to
//! another origin. Owns no state: the routes are wired in `admin::router`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::admin::ops::AdminOps;

/// The page, embedded at build time.
pub const PAGE: &str = include_str!("../../assets/status.html");

/// The page's Content-Security-Policy: inline script and style only, requests to this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
     img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the status page.
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /api/v1/events`: the last flips, reloads and admin actions, the last flip of every
/// master, the check history of every port, and the generation in force.
pub(crate) async fn events(State(s): State<Arc<dyn AdminOps>>) -> Response {
    Json(s.events().view()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for needle in [
            "http://", "https://", "//cdn", "<link", "src=\"", "@import", "url(",
        ] {
            assert!(
                !PAGE.contains(needle),
                "the status page must be self-contained, found {needle:?}"
            );
        }
    }

    #[test]
    fn the_page_puts_data_in_text_not_markup() {
        assert!(
            !PAGE.contains("innerHTML"),
            "master names, reasons and minion ids come from outside: set textContent"
        );
    }
}
