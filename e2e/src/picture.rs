//! Pictures for the tests that look at what a person would see: an SVG rendered to PNG by a
//! real renderer (librsvg's `rsvg-convert`, Debian librsvg2-bin), and the PNG's pixels.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// Renders `svg` to a PNG beside it with rsvg-convert; fails when the renderer refuses the file.
pub fn render_svg(svg: &Path) -> Result<PathBuf> {
    let png = svg.with_extension("png");
    let out = Command::new("rsvg-convert")
        .arg("--format=png")
        .arg("--output")
        .arg(&png)
        .arg(svg)
        .output()
        .context("running rsvg-convert (Debian's librsvg2-bin; hack/setup.sh installs it)")?;
    if !out.status.success() {
        bail!(
            "rsvg-convert refused {}: {}",
            svg.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(png)
}

/// A decoded PNG: size and RGBA pixels, row by row.
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<[u8; 4]>,
}

impl Picture {
    pub fn load(png: &Path) -> Result<Picture> {
        let mut dec = png::Decoder::new(std::fs::File::open(png)?);
        dec.set_transformations(
            png::Transformations::normalize_to_color8() | png::Transformations::ALPHA,
        );
        let mut reader = dec.read_info()?;
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf)?;
        ensure!(
            info.color_type == png::ColorType::Rgba,
            "{:?} after expanding to RGBA",
            info.color_type
        );
        let pixels = buf[..info.buffer_size()]
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();
        Ok(Picture {
            width: info.width,
            height: info.height,
            pixels,
        })
    }

    /// Pixels of exactly the colour `#rrggbb`, opaque.
    pub fn count(&self, hex: &str) -> usize {
        let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0);
        let c = [(v >> 16) as u8, (v >> 8) as u8, v as u8, 255];
        self.pixels.iter().filter(|p| **p == c).count()
    }
}
