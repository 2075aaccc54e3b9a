//! The bench's table as a chart, `target/bench/bench.svg`: each scenario's median CPU per request,
//! Envoy's and (for tollgate) Webdis' and Redis' stacked after it, with the wasm floor and the two
//! goals measured against it marked. The same medians as the table, nothing recomputed.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::goals::{EXACT_FLOOR_LIMIT_X, LEASE_FLOOR_LIMIT_X};
use crate::report::Outcome;
use crate::rows::Row;

const ENVOY: RGBColor = RGBColor(0, 114, 178);
const BACKEND: RGBColor = RGBColor(230, 159, 0);
const FLOOR: RGBColor = RGBColor(213, 94, 0);

/// A bar's label: its scenario, and whether its load was paced (a fixed rate, so its CPU per
/// request carries the idle time between requests and is not comparable with the closed loops').
fn label(row: &Row) -> String {
    if row.def.paced() {
        format!("{} (paced)", row.def.name)
    } else {
        row.def.name.to_string()
    }
}

/// Writes the chart of `run`'s rows to `path` (its directory is created).
pub fn write(path: &Path, run: &Outcome, rounds: u32) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let caption = format!(
        "make bench {}: CPU µs per request, medians of {rounds} rounds",
        run.machine.date
    );
    draw(path, &caption, &run.rows).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw(path: &Path, caption: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.cpu.is_some()).collect();
    let n = rows.len();
    let total = |r: &Row| r.cpu.unwrap_or(0.0) + backend(r);
    let widest = rows.iter().map(|r| total(r)).fold(1.0, f64::max);
    let floor = row_named_cpu(&rows, "wasm-floor");

    let height = 90 + 28 * u32::try_from(n).unwrap_or(0);
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let n_i32 = i32::try_from(n)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(280)
        // A segmented range has a band for each end: 0..n-1 is n bands.
        .build_cartesian_2d(0.0..widest * 1.25, (0..n_i32 - 1).into_segmented())?;
    // Row 0 at the top, as in the table.
    let y_of = |i: usize| n_i32 - 1 - i32::try_from(i).unwrap_or(0);
    let names: Vec<String> = rows.iter().map(|r| label(r)).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .max_light_lines(1)
        .x_desc("CPU µs per request (Envoy, then Webdis + Redis)")
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(y) => usize::try_from(n_i32 - 1 - y)
                .ok()
                .and_then(|i| names.get(i))
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 12))
        .draw()?;

    let bar = |x0: f64, x1: f64, y: i32, colour: RGBColor| {
        let mut r = Rectangle::new(
            [
                (x0, SegmentValue::Exact(y)),
                (x1, SegmentValue::Exact(y + 1)),
            ],
            colour.filled(),
        );
        r.set_margin(5, 5, 0, 0);
        r
    };
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, r)| bar(0.0, r.cpu.unwrap_or(0.0), y_of(i), ENVOY)),
        )?
        .label("Envoy")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], ENVOY.filled()));
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .filter(|(_, r)| backend(r) > 0.0)
                .map(|(i, r)| {
                    let envoy = r.cpu.unwrap_or(0.0);
                    bar(envoy, envoy + backend(r), y_of(i), BACKEND)
                }),
        )?
        .label("Webdis + Redis")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], BACKEND.filled()));
    chart.draw_series(rows.iter().enumerate().map(|(i, r)| {
        let text = match backend(r) {
            b if b > 0.0 => format!("{:.1} + {b:.1}", r.cpu.unwrap_or(0.0)),
            _ => format!("{:.1}", r.cpu.unwrap_or(0.0)),
        };
        Text::new(
            text,
            (total(r) + widest * 0.01, SegmentValue::CenterOf(y_of(i))),
            TextStyle::from(("sans-serif", 11)).pos(Pos::new(HPos::Left, VPos::Center)),
        )
    }))?;

    if let Some(floor) = floor {
        let top = SegmentValue::Last;
        let bottom = SegmentValue::Exact(0);
        let marks = [
            (
                floor,
                format!("wasm floor (empty filter): {floor:.1}"),
                FLOOR.stroke_width(2),
            ),
            (
                floor * LEASE_FLOOR_LIMIT_X,
                format!("lease goal: {LEASE_FLOOR_LIMIT_X:.2}× the floor"),
                FLOOR.mix(0.6).stroke_width(1),
            ),
            (
                floor * EXACT_FLOOR_LIMIT_X,
                format!("exact goal: {EXACT_FLOOR_LIMIT_X:.1}× the floor"),
                FLOOR.mix(0.6).stroke_width(1),
            ),
        ];
        for (x, name, style) in marks {
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, bottom.clone()), (x, top.clone())],
                    5,
                    3,
                    style,
                ))?
                .label(name)
                .legend(move |(lx, ly)| PathElement::new([(lx, ly), (lx + 14, ly)], style));
        }
    }
    chart
        .configure_series_labels()
        // The top rows (plain, the floors) are the shortest bars.
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 12))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Webdis' and Redis' CPU per request, for the rows that have it (tollgate's).
fn backend(r: &Row) -> f64 {
    match r.def.tollgate_mode() {
        Some(_) => r.backend_cpu.unwrap_or(0.0),
        None => 0.0,
    }
}

fn row_named_cpu(rows: &[&Row], name: &str) -> Option<f64> {
    rows.iter().find(|r| r.def.name == name).and_then(|r| r.cpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::Sample;
    use crate::scenarios::SCENARIOS;

    fn row(name: &str, us: f64) -> Row {
        let def = *SCENARIOS.iter().find(|d| d.name == name).unwrap();
        let s = Sample {
            requests: 1,
            cpu_us_per_req: us,
            backend_cpu_us_per_req: 20.0,
            ..Sample::default()
        };
        crate::rows::summarize(def, vec![s], &[])
    }

    #[test]
    fn every_scenario_and_the_floor_are_drawn() {
        let rows = [
            row("plain", 30.0),
            row("wasm-floor", 40.0),
            row("tollgate-exact", 80.0),
        ];
        let path = std::env::temp_dir().join(format!("bench-chart-{}.svg", std::process::id()));
        draw(&path, "test", &rows).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        // The SVG backend writes each text on a line of its own.
        for text in [
            "plain",
            "wasm-floor",
            "tollgate-exact",
            "wasm floor (empty filter): 40.0",
            "80.0 + 20.0",
        ] {
            assert!(svg.contains(&format!("\n{text}\n")), "{text} missing");
        }
        // Webdis + Redis only on tollgate's bar: plain's reads 30.0 alone.
        assert!(svg.contains("\n30.0\n"));
    }
}
