//! Every rewrite rule, applied, leaves the numbers unchanged: each rule's
//! example trace runs before and after `optimize` on random inputs, and the
//! results agree within the dtype's written tolerance.

#[path = "../../rewrite_rules/tests/common/mod.rs"]
mod common;

use common::rule_traces::trace_for;
use deferfuse::differential::{compare, random_inputs, run_reference};
use rewrite_rules::{optimize, RewriteConfig, RuleSets};

#[test]
fn every_rule_preserves_the_numbers() {
    let mut checked = 0;
    for set in RuleSets::NAMES {
        for name in RuleSets::rule_names(set) {
            let trace =
                trace_for(&name).unwrap_or_else(|| panic!("rule {name} has no example trace"));
            let optimized = optimize(&trace, &RewriteConfig::default()).unwrap();
            assert!(
                optimized.report.rules_fired.contains_key(&name),
                "{name} did not fire: {:?}",
                optimized.report
            );
            let metas: Vec<_> = trace.parameters().iter().map(|&p| trace.meta(p).clone()).collect();
            for seed in 0..5 {
                let inputs = random_inputs(&metas, seed);
                let before = run_reference(&trace, &inputs).unwrap();
                let after = run_reference(&optimized.trace, &inputs).unwrap();
                compare(&after, &before, None)
                    .unwrap_or_else(|e| panic!("rule {name}, seed {seed}: {e}"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} rules checked");
}
