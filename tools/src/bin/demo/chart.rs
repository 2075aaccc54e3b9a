//! The demo's chart, `target/demo/demo.svg`: one panel per part of the demo, each user's admissions
//! over time as a staircase, against what one bucket allows (burst + rate × t, dashed). The chart
//! draws what the senders saw, nothing computed: a staircase above the dashed line would be a
//! limit broken, and the run already fails on that before the chart is drawn.

use std::path::Path;

use plotters::prelude::*;

/// One user's admissions: (seconds since its first request was sent, its running total once that
/// admission's answer came back), in order.
pub struct Line {
    pub user: &'static str,
    pub steps: Vec<(f64, f64)>,
}

/// One part of the demo: its title, what the y axis counts, the bucket every user has (each user has
/// its own, all alike), and each user's line.
pub struct Panel {
    pub title: String,
    pub y_desc: &'static str,
    pub burst: f64,
    pub per_second: f64,
    /// How long the users sent, so every line and the allowance end at the same x.
    pub seconds: f64,
    /// Said after the allowance in the legend (part two: usage is charged after the answer).
    pub note: &'static str,
    pub lines: Vec<Line>,
}

/// Distinct on white and for the common colour blindnesses (Okabe and Ito's palette).
const COLOURS: [RGBColor; 5] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
];

/// Writes `panels` side by side into the SVG at `path` (its directory is created).
pub fn write(path: &Path, panels: &[Panel]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let width = 560 * u32::try_from(panels.len().max(1)).unwrap_or(1);
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, panel) in areas.iter().zip(panels) {
        draw(area, panel).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    root.present().map_err(|e| e.to_string())
}

/// The staircase of a line: flat until each admission, then up by what it added.
fn staircase(line: &Line, until: f64) -> Vec<(f64, f64)> {
    let mut points = vec![(0.0, 0.0)];
    let mut level = 0.0;
    for &(t, total) in &line.steps {
        points.push((t, level));
        points.push((t, total));
        level = total;
    }
    points.push((until, level));
    points
}

fn draw(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), Box<dyn std::error::Error>> {
    let allows = |t: f64| panel.burst + panel.per_second * t;
    let highest = panel
        .lines
        .iter()
        .flat_map(|l| l.steps.iter().map(|s| s.1))
        .fold(allows(panel.seconds), f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..panel.seconds, 0.0..highest * 1.08)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the user's first request")
        .y_desc(panel.y_desc)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .max_light_lines(0)
        .label_style(("sans-serif", 12))
        .draw()?;

    let allowance = [(0.0, allows(0.0)), (panel.seconds, allows(panel.seconds))];
    chart
        .draw_series(DashedLineSeries::new(
            allowance,
            6,
            4,
            BLACK.stroke_width(2),
        ))?
        .label(format!(
            "bucket allows: {} + {} × t{}",
            panel.burst, panel.per_second, panel.note
        ))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));

    for (line, colour) in panel.lines.iter().zip(COLOURS.iter().cycle()) {
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(staircase(line, panel.seconds), style))?
            .label(line.user)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}
