//! The loss-curve plot (SVG): one line per run, on a log scale.

use std::path::Path;

use plotters::prelude::*;

/// A named loss curve.
pub struct Curve<'a> {
    /// Legend text.
    pub label: &'a str,
    /// One loss per step.
    pub losses: &'a [f32],
}

/// Draws `curves` into an SVG file at `path`. Curves that coincide overlay exactly:
/// the later ones are drawn dashed on top, so both stay visible.
pub fn loss_curves(path: &Path, title: &str, curves: &[Curve<'_>]) -> anyhow::Result<()> {
    let steps = curves
        .iter()
        .map(|c| c.losses.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let positive = curves
        .iter()
        .flat_map(|c| c.losses.iter().copied())
        .filter(|l| l.is_finite() && *l > 0.0);
    let (low, high) = positive.fold((f32::MAX, f32::MIN), |(lo, hi), l| (lo.min(l), hi.max(l)));
    anyhow::ensure!(low <= high, "no positive finite loss to plot");

    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1..steps, (low * 0.9..high * 1.1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("training loss (MSE)")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (index, curve) in curves.iter().enumerate() {
        let color = colors[index % colors.len()];
        let points = curve.losses.iter().enumerate().map(|(i, l)| (i + 1, *l));
        let style = color.stroke_width(if index == 0 { 3 } else { 1 });
        let series = if index == 0 {
            chart.draw_series(LineSeries::new(points, style))?
        } else {
            chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?
        };
        series
            .label(curve.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_curves_make_an_svg_with_both_legends() {
        let dir = std::env::temp_dir().join(format!("plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("loss.svg");
        let losses = [1.0, 0.5, 0.25, 0.2];
        let curves = [
            Curve {
                label: "graphed",
                losses: &losses,
            },
            Curve {
                label: "eager",
                losses: &losses,
            },
        ];
        loss_curves(&path, "test", &curves).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        assert!(svg.contains("graphed") && svg.contains("eager"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let path = std::env::temp_dir().join("never-written.svg");
        let curves = [Curve {
            label: "nan",
            losses: &[f32::NAN],
        }];
        assert!(loss_curves(&path, "test", &curves).is_err());
    }
}
