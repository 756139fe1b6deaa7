//! Which named rule sets a run uses.

use std::sync::OnceLock;

use trace_ir::{Error, Result};

use crate::guard::TensorRewrite;

/// The rule sets, each on or off. All are on by default; turning one off is
/// the way to bisect a difference between optimized and unoptimized runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleSets {
    /// Exact IEEE identities ([`crate::algebraic`]).
    pub algebraic: bool,
    /// Layout chains and no-op layout ops ([`crate::layout`]).
    pub layout: bool,
    /// Constant folding ([`crate::fold`]).
    pub fold: bool,
    /// Lifting composites to fused forms ([`crate::patterns`]).
    pub patterns: bool,
}

impl Default for RuleSets {
    fn default() -> Self {
        RuleSets { algebraic: true, layout: true, fold: true, patterns: true }
    }
}

/// A set's rule constructor.
type RuleTable = fn() -> Vec<TensorRewrite>;

/// A rule and the name of the set it belongs to.
type SetRule = (&'static str, TensorRewrite);

/// Every rule, built once: parsing patterns is not free and rules are immutable.
fn all_rules() -> &'static [SetRule] {
    static RULES: OnceLock<Vec<SetRule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let sets: [(&'static str, RuleTable); 4] = [
            ("algebraic", crate::algebraic::rules),
            ("layout", crate::layout::rules),
            ("fold", crate::fold::rules),
            ("patterns", crate::patterns::rules),
        ];
        sets.into_iter()
            .flat_map(|(set, rules)| rules().into_iter().map(move |r| (set, r)))
            .collect()
    })
}

impl RuleSets {
    /// The names of the sets, as [`RuleSets::set`] takes them.
    pub const NAMES: [&'static str; 4] = ["algebraic", "layout", "fold", "patterns"];

    /// Every set off.
    pub fn none() -> Self {
        RuleSets { algebraic: false, layout: false, fold: false, patterns: false }
    }

    fn slot(&mut self, name: &str) -> Option<&mut bool> {
        match name {
            "algebraic" => Some(&mut self.algebraic),
            "layout" => Some(&mut self.layout),
            "fold" => Some(&mut self.fold),
            "patterns" => Some(&mut self.patterns),
            _ => None,
        }
    }

    /// Turns the set `name` on or off.
    ///
    /// ```
    /// let mut sets = rewrite_rules::RuleSets::default();
    /// sets.set("patterns", false).unwrap();
    /// assert!(!sets.is_on("patterns") && sets.is_on("fold"));
    /// assert!(rewrite_rules::RuleSets::rule_names("patterns").contains(&"softmax".to_string()));
    /// assert!(sets.set("fusion", true).is_err());
    /// ```
    pub fn set(&mut self, name: &str, on: bool) -> Result<()> {
        match self.slot(name) {
            Some(slot) => {
                *slot = on;
                Ok(())
            }
            None => Err(Error::Config {
                var: "rule set".into(),
                value: name.into(),
                valid: Self::NAMES.join(", "),
            }),
        }
    }

    /// Whether the set `name` is on (unknown names are off).
    pub fn is_on(&self, name: &str) -> bool {
        match name {
            "algebraic" => self.algebraic,
            "layout" => self.layout,
            "fold" => self.fold,
            "patterns" => self.patterns,
            _ => false,
        }
    }

    /// The names of the rules of set `name`, in the order they run.
    pub fn rule_names(name: &str) -> Vec<String> {
        all_rules()
            .iter()
            .filter(|(set, _)| *set == name)
            .map(|(_, r)| r.name.to_string())
            .collect()
    }

    /// The rules of the sets that are on.
    pub fn rules(&self) -> Vec<&'static TensorRewrite> {
        all_rules().iter().filter(|(set, _)| self.is_on(set)).map(|(_, r)| r).collect()
    }
}
