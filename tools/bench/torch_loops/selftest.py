"""Checks run_set.py's summary on made-up runs (no GPU, no torch): medians over the rounds
after the first, the first round apart, PyTorch's best own configuration, the ratios to it
and to the no-cache floor, the floor as the largest of its runs, maps per step of the last
quarter, variants parsed with commas inside values. Run by `make test`."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_set  # noqa: E402


def run(rnd, loop, config, wall, steady, nvml, maps=None):
    r = {"round": rnd, "loop": loop, "config": config, "ok": True, "wall_s": wall, "steady_s": steady,
         "nvml_peak": nvml, "final_loss": 1.0, "steady_steps": 40}
    if maps is not None:
        r["shim"] = {"maps": [0, 0, 0, 0, maps], "unmaps": [0] * 5, "barriers": [0, 0, 0, 0, 20],
                     "total_maps": 99, "total_barriers": 7}
    return r


class Summary(unittest.TestCase):
    def setUp(self):
        runs = []
        for rnd, (t, e, p) in enumerate([(9.0, 9.0, 9.0), (2.0, 1.9, 1.8), (2.2, 1.8, 1.7), (2.1, 2.0, 1.9)]):
            runs.append(run(rnd, "a", "torch", t, t / 2, 300))
            runs.append(run(rnd, "a", "expandable", e, e / 2, 200))
            runs.append(run(rnd, "a", "poolshim", p, p / 2, 150, maps=5))
        runs.append(run(0, "a", "nocache", 5.0, 2.5, 140))
        runs.append(run(1, "a", "nocache", 5.0, 2.5, 146))
        self.s = run_set.summarize(runs, ["nocache", "torch", "expandable", "poolshim"])["a"]

    def test_medians_leave_the_first_round_apart(self):
        c = self.s["configs"]
        self.assertAlmostEqual(c["torch"]["wall_s"], 2.1)
        self.assertAlmostEqual(c["torch"]["first_round_wall_s"], 9.0)
        self.assertAlmostEqual(c["poolshim"]["wall_s"], 1.8)

    def test_best_own_and_ratios(self):
        self.assertEqual(self.s["best_own"], "expandable")
        self.assertAlmostEqual(self.s["configs"]["poolshim"]["wall_vs_best"], 1.8 / 1.9)
        self.assertNotIn("poolshim", run_set.TORCH_OWN)

    def test_floor_is_the_largest_nocache_peak(self):
        self.assertEqual(self.s["configs"]["nocache"]["nvml_peak"], 146)
        self.assertAlmostEqual(self.s["configs"]["poolshim"]["nvml_vs_floor"], 150 / 146)
        self.assertAlmostEqual(self.s["configs"]["poolshim"]["nvml_vs_expandable"], 150 / 200)

    def test_maps_per_step_of_the_last_quarter(self):
        self.assertAlmostEqual(self.s["configs"]["poolshim"]["maps_last_quarter_per_step"], 0.5)
        self.assertAlmostEqual(self.s["configs"]["poolshim"]["barriers_last_quarter_per_step"], 2.0)

    def test_text_report_has_a_row_per_config(self):
        text = run_set.text_report({"a": self.s}, {"gpu": "x"})
        for c in ("nocache", "torch", "expandable", "poolshim"):
            self.assertIn("  %s " % c, text)
        self.assertIn("summary:", text)


class Variants(unittest.TestCase):
    def test_commas_inside_a_value(self):
        name, env = run_set.parse_variant("p8:POOLSHIM_OPTIONS=a.b=1,c.d=2,POOLSHIM_VERBOSE=1", "/lib.so")
        self.assertEqual(name, "p8")
        self.assertEqual(env["POOLSHIM_OPTIONS"], "a.b=1,c.d=2")
        self.assertEqual(env["POOLSHIM_VERBOSE"], "1")
        self.assertEqual(env["LD_PRELOAD"], "/lib.so")

    def test_bad_name(self):
        with self.assertRaises(SystemExit):
            run_set.parse_variant("bad name:X=1", "/lib.so")


if __name__ == "__main__":
    unittest.main()
