//! Line plots in the style of the papers' figures: time against cache size
//! or record size, one line per policy, one panel per pattern.

use plotters::prelude::*;
use std::path::Path;

/// One line of a panel.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel (sub-figure).
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// A dashed horizontal reference line (the ideal time), if any.
    pub reference: Option<(String, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Draws the panels stacked vertically into an SVG file.
pub fn draw(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let height = 60 + 360 * panels.len() as u32;
    let root = SVGBackend::new(path, (760, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
    let areas = root.split_evenly((panels.len(), 1));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let xs = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let ys = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let y1 = ys.fold(panel.reference.as_ref().map_or(0.0, |r| r.1), f64::max) * 1.08;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, 0.0..y1.max(1e-9))
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(panel.x_label.as_str())
            .y_desc(panel.y_label.as_str())
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| err(&e))?;
        if let Some((label, y)) = &panel.reference {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x0, *y), (x1, *y)],
                    6,
                    4,
                    BLACK.mix(0.5).stroke_width(1),
                ))
                .map_err(|e| err(&e))?
                .label(label.as_str())
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.5)));
        }
        for (i, s) in panel.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// One bar of [`bars`]: a label and two values drawn one over the other
/// (the second, at least as long, lighter behind the first).
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub behind: f64,
}

/// Horizontal bars, top to bottom in the given order, into an SVG file
/// (the advisor's comparison of policy combinations).
pub fn bars(path: &Path, title: &str, x_label: &str, legend: (&str, &str), rows: &[Bar]) -> Result<(), String> {
    let height = 110 + 26 * rows.len().max(1) as u32;
    let root = SVGBackend::new(path, (980, height)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x1 = rows.iter().map(|b| b.value.max(b.behind)).fold(0.0, f64::max) * 1.05;
    let n = rows.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(12)
        .build_cartesian_2d(0.0..x1.max(1e-9), 0.0..n.max(1.0))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .disable_y_mesh()
        .disable_y_axis()
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| err(&e))?;
    let (front, back) = (COLORS[0].mix(0.5), COLORS[0].mix(0.18));
    // Row i is drawn from the top.
    let y = |i: usize| n - i as f64;
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, b)| Rectangle::new([(0.0, y(i) - 0.85), (b.behind, y(i) - 0.15)], back.filled())),
        )
        .map_err(|e| err(&e))?
        .label(legend.1)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], back.filled()));
    chart
        .draw_series(
            rows.iter()
                .enumerate()
                .map(|(i, b)| Rectangle::new([(0.0, y(i) - 0.85), (b.value, y(i) - 0.15)], front.filled())),
        )
        .map_err(|e| err(&e))?
        .label(legend.0)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], front.filled()));
    chart
        .draw_series(rows.iter().enumerate().map(|(i, b)| {
            Text::new(
                b.label.clone(),
                (x1 * 0.01, y(i) - 0.3),
                ("sans-serif", 13).into_font().color(&BLACK),
            )
        }))
        .map_err(|e| err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
