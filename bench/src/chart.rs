//! The PNG chart: one horizontal bar per cost figure (CPU, memory, latency, time; not rates)
//! that has a saltgate/HAProxy ratio, green when
//! it meets the goal, red when not, grey without a goal; a black tick marks the goal and
//! a dashed line 1.0 (parity). Text is drawn with DejaVu Sans embedded in the binary
//! (`bench/assets`), so no system font is needed.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{higher_is_better, Row};
use crate::BenchError;

/// Bars longer than this are cut (their label still gives the ratio).
const MAX_RATIO: f64 = 3.0;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() -> Result<(), BenchError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(BenchError::Chart(
            "the embedded DejaVu Sans font did not load".into(),
        ))
    }
}

fn chart_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Chart(e.to_string())
}

/// Draws the ratios of `rows` into a PNG at `path`. Rows without a ratio are left out.
pub fn draw(rows: &[Row], title: &str, path: &Path) -> Result<(), BenchError> {
    register_font()?;
    let bars: Vec<&Row> = rows
        .iter()
        .filter(|r| r.ratio.is_some() && !higher_is_better(r.figure))
        .collect();
    if bars.is_empty() {
        return Err(BenchError::Chart(
            "no figure has a saltgate/HAProxy ratio to draw".into(),
        ));
    }
    let n = bars.len();
    let max_x = bars
        .iter()
        .flat_map(|r| [r.ratio.unwrap_or(0.0), r.goal.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        .min(MAX_RATIO)
        * 1.15;
    let height = 90 + 26 * n as u32;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let labels: Vec<String> = bars
        .iter()
        .map(|r| format!("{}: {} ({})", r.scenario, r.figure, r.case))
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(430)
        .build_cartesian_2d(0f64..max_x, 0f64..n as f64)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("saltgate / HAProxy (lower is better)")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(chart_err)?;
    let y = |i: usize| (n - 1 - i) as f64;
    for (i, r) in bars.iter().enumerate() {
        let ratio = r.ratio.unwrap_or(0.0);
        let bar = ratio.min(MAX_RATIO);
        let color = match r.met {
            Some(true) => RGBColor(46, 160, 67),
            Some(false) => RGBColor(215, 58, 73),
            None => RGBColor(150, 150, 150),
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y(i) + 0.15), (bar, y(i) + 0.85)],
                color.filled(),
            )))
            .map_err(chart_err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{ratio:.2}×"),
                (bar + max_x * 0.01, y(i) + 0.7),
                ("sans-serif", 12),
            )))
            .map_err(chart_err)?;
        if let Some(g) = r.goal {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(g, y(i) + 0.02), (g, y(i) + 0.98)],
                    BLACK.stroke_width(3),
                )))
                .map_err(chart_err)?;
        }
    }
    chart
        .draw_series(DashedLineSeries::new(
            vec![(1.0, 0.0), (1.0, n as f64)],
            6,
            4,
            BLACK.into(),
        ))
        .map_err(chart_err)?;
    // Row labels, right-aligned against the plotting area.
    let (px, _) = chart.backend_coord(&(0.0, 0.0));
    for (i, label) in labels.iter().enumerate() {
        let (_, py) = chart.backend_coord(&(0.0, y(i) + 0.5));
        root.draw(&Text::new(
            label.clone(),
            (px - 8, py),
            ("sans-serif", 13).into_font().color(&BLACK).pos(
                plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Right,
                    plotters::style::text_anchor::VPos::Center,
                ),
            ),
        ))
        .map_err(chart_err)?;
    }
    root.present().map_err(chart_err)?;
    Ok(())
}
