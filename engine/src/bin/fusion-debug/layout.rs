//! A small compound layered (Sugiyama-style) layout: ops are layered inside
//! each kernel, then kernels are layered as boxes by their data dependencies.
//! Laying out the two levels separately keeps every kernel one rectangle that
//! no other kernel overlaps, which a flat layout with clusters drawn around
//! it does not guarantee. (The layout crates we looked at, such as
//! `layout-rs`, lay out flat graphs without clusters.)

use crate::graph::Drawn;

pub const OP_HEIGHT: f64 = 30.0;
const OP_GAP_X: f64 = 14.0;
const OP_GAP_Y: f64 = 26.0;
const PAD: f64 = 12.0;
pub const TITLE: f64 = 20.0;
const GROUP_GAP_X: f64 = 36.0;
const GROUP_GAP_Y: f64 = 64.0;
const MARGIN: f64 = 20.0;

/// A rectangle: left, top, width, height.
#[derive(Clone, Copy, Default)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

impl Rect {
    pub fn center_x(&self) -> f64 {
        self.x + self.w / 2.0
    }
    pub fn bottom(&self) -> f64 {
        self.y + self.h
    }
}

/// Where everything goes.
pub struct Laid {
    pub width: f64,
    pub height: f64,
    /// One per group.
    pub groups: Vec<Rect>,
    /// `ops[g][i]`: op `i` of group `g`.
    pub ops: Vec<Vec<Rect>>,
}

/// The width an op's box needs for its label.
pub fn op_width(label: &str) -> f64 {
    (label.chars().count() as f64 * 7.2 + 18.0).max(48.0)
}

pub fn lay_out(drawn: &Drawn) -> Laid {
    // Inside each group: positions relative to the group's top-left corner.
    let mut inner: Vec<(Vec<Rect>, f64, f64)> = Vec::with_capacity(drawn.groups.len());
    for (g, group) in drawn.groups.iter().enumerate() {
        let n = group.ops.len();
        let edges: Vec<(usize, usize)> = drawn
            .edges
            .iter()
            .filter(|e| e.from.0 == g && e.to.0 == g)
            .map(|e| (e.from.1, e.to.1))
            .collect();
        let widths: Vec<f64> = group.ops.iter().map(|o| op_width(&o.label)).collect();
        let layers = order_layers(n, &edges);
        let (rects, w, h) = place(&layers, &widths, OP_HEIGHT, OP_GAP_X, OP_GAP_Y);
        let title_w = group.title.chars().count() as f64 * 7.0 + 2.0 * PAD;
        inner.push((rects, (w + 2.0 * PAD).max(title_w), h + 2.0 * PAD + TITLE));
    }

    // Groups as boxes, layered by the edges between them.
    let mut between: Vec<(usize, usize)> =
        drawn.edges.iter().filter(|e| e.from.0 != e.to.0).map(|e| (e.from.0, e.to.0)).collect();
    between.sort_unstable();
    between.dedup();
    let layers = order_layers(drawn.groups.len(), &between);
    let widths: Vec<f64> = inner.iter().map(|i| i.1).collect();
    let heights: Vec<f64> = inner.iter().map(|i| i.2).collect();
    let (mut boxes, width, height) =
        place_sized(&layers, &widths, &heights, GROUP_GAP_X, GROUP_GAP_Y);
    for b in &mut boxes {
        b.x += MARGIN;
        b.y += MARGIN;
    }

    let ops = inner
        .iter()
        .zip(&boxes)
        .map(|((rects, w, _), b)| {
            // Centre the op layout inside its (possibly title-widened) box.
            let used = rects.iter().map(|r| r.x + r.w).fold(0.0, f64::max);
            let shift = (w - 2.0 * PAD - used) / 2.0;
            rects
                .iter()
                .map(|r| Rect { x: b.x + PAD + shift + r.x, y: b.y + TITLE + PAD + r.y, ..*r })
                .collect()
        })
        .collect();
    Laid { width: width + 2.0 * MARGIN, height: height + 2.0 * MARGIN, groups: boxes, ops }
}

/// Assigns each of `n` items (edges `from -> to`, acyclic) a layer by
/// longest path from the sources, then orders each layer by the mean
/// position of its neighbours in the layer above and below (a few sweeps).
fn order_layers(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    let mut layer = vec![0usize; n];
    // Items are in topological order in every caller (node ids ascend, kernels
    // run in order), but relax until stable to be safe: at most n rounds.
    for _ in 0..n.max(1) {
        let mut changed = false;
        for &(a, b) in edges {
            if a != b && layer[b] < layer[a] + 1 && layer[a] < n {
                layer[b] = layer[a] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Sources (program inputs) go just above their first reader, not all on top.
    for i in 0..n {
        if edges.iter().all(|&(_, b)| b != i) {
            let first_reader =
                edges.iter().filter(|&&(a, b)| a == i && b != i).map(|&(_, b)| layer[b]).min();
            if let Some(l) = first_reader {
                layer[i] = l.saturating_sub(1);
            }
        }
    }
    let depth = layer.iter().copied().max().map_or(0, |d| d + 1);
    let mut layers = vec![Vec::new(); depth];
    for (i, &l) in layer.iter().enumerate() {
        layers[l].push(i);
    }
    let mut position = vec![0.0; n];
    let mut sweep = |layers: &mut Vec<Vec<usize>>, down: bool| {
        for l in &*layers {
            for (p, &i) in l.iter().enumerate() {
                position[i] = p as f64;
            }
        }
        let order: Vec<usize> = if down {
            (1..layers.len()).collect()
        } else {
            (0..layers.len().saturating_sub(1)).rev().collect()
        };
        for l in order {
            let mut keyed: Vec<(f64, usize)> = layers[l]
                .iter()
                .map(|&i| {
                    let near: Vec<f64> = edges
                        .iter()
                        .filter_map(|&(a, b)| match down {
                            true if b == i && layer[a] < layer[b] => Some(position[a]),
                            false if a == i && layer[a] < layer[b] => Some(position[b]),
                            _ => None,
                        })
                        .collect();
                    let key = if near.is_empty() {
                        position[i]
                    } else {
                        near.iter().sum::<f64>() / near.len() as f64
                    };
                    (key, i)
                })
                .collect();
            keyed.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            layers[l] = keyed.into_iter().map(|(_, i)| i).collect();
            for (p, &i) in layers[l].iter().enumerate() {
                position[i] = p as f64;
            }
        }
    };
    for down in [true, false, true] {
        sweep(&mut layers, down);
    }
    layers
}

/// Places equal-height items row by row, each row centred.
fn place(
    layers: &[Vec<usize>],
    widths: &[f64],
    height: f64,
    gap_x: f64,
    gap_y: f64,
) -> (Vec<Rect>, f64, f64) {
    let heights = vec![height; widths.len()];
    place_sized(layers, widths, &heights, gap_x, gap_y)
}

/// Places items row by row (one row per layer), each row centred on the
/// widest; returns the rectangles and the total width and height.
fn place_sized(
    layers: &[Vec<usize>],
    widths: &[f64],
    heights: &[f64],
    gap_x: f64,
    gap_y: f64,
) -> (Vec<Rect>, f64, f64) {
    let row_width = |l: &Vec<usize>| {
        l.iter().map(|&i| widths[i]).sum::<f64>() + gap_x * l.len().saturating_sub(1) as f64
    };
    let width = layers.iter().map(row_width).fold(0.0, f64::max);
    let mut rects = vec![Rect::default(); widths.len()];
    let mut y = 0.0;
    for l in layers {
        let mut x = (width - row_width(l)) / 2.0;
        let row_height = l.iter().map(|&i| heights[i]).fold(0.0, f64::max);
        for &i in l {
            rects[i] = Rect { x, y, w: widths[i], h: heights[i] };
            x += widths[i] + gap_x;
        }
        y += row_height + gap_y;
    }
    (rects, width, (y - gap_y).max(0.0))
}
