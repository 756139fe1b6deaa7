//! One named rule for the several ways people write one formula.

use egg::{Id, Pattern, SearchMatches, Searcher, Var};

use crate::guard::pattern;
use crate::{TensorAnalysis, TensorGraph, TensorNode};

/// A searcher matching any of several patterns that bind the same
/// variables: one named rule for the ways people write one formula.
#[derive(Debug)]
pub struct AnyOf {
    patterns: Vec<Pattern<TensorNode>>,
}

/// The alternatives `patterns`, as one searcher.
pub fn any_of<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> AnyOf {
    let patterns: Vec<_> = patterns.into_iter().map(|p| pattern(p.as_ref())).collect();
    let vars = |p: &Pattern<TensorNode>| {
        let mut v = p.vars();
        v.sort();
        v
    };
    assert!(
        patterns.windows(2).all(|w| vars(&w[0]) == vars(&w[1])),
        "alternatives must bind the same variables"
    );
    AnyOf { patterns }
}

impl Searcher<TensorNode, TensorAnalysis> for AnyOf {
    fn search_eclass_with_limit(
        &self,
        egraph: &TensorGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, TensorNode>> {
        let mut substs = Vec::new();
        for p in &self.patterns {
            if substs.len() >= limit {
                break;
            }
            if let Some(m) = p.search_eclass_with_limit(egraph, eclass, limit - substs.len()) {
                substs.extend(m.substs);
            }
        }
        (!substs.is_empty()).then_some(SearchMatches { eclass, substs, ast: None })
    }

    fn search_with_limit(
        &self,
        egraph: &TensorGraph,
        limit: usize,
    ) -> Vec<SearchMatches<'_, TensorNode>> {
        // Each alternative searches only the classes holding its root op.
        let mut out = Vec::new();
        let mut left = limit;
        for p in &self.patterns {
            for m in p.search_with_limit(egraph, left) {
                left -= m.substs.len();
                out.push(SearchMatches { eclass: m.eclass, substs: m.substs, ast: None });
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        self.patterns.first().map(|p| p.vars()).unwrap_or_default()
    }
}
