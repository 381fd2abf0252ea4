"""Tests of check_stats.py (run on the CPU by `make test`): sums over the
devices, per-device conditions (deviceN.PATH), string comparisons and the
exit statuses, on a report shaped like the shim's JSON with two devices."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = {
    "poolshim": 1, "pid": 7, "rank": 1, "passthrough": 0, "invalid_frees": 0,
    "devices": [
        {"device": 0, "stack": "dev0pool", "failures": 0, "expandable": 1,
         "calls": {"cudaMalloc": 10}, "bytes": {"reserved_peak": 300 << 20}},
        {"device": 1, "stack": "dev1cap", "failures": 2, "expandable": 0,
         "calls": {"cudaMalloc": 5}, "bytes": {"reserved_peak": 60 << 20}},
    ],
}


def check(*conditions, report=REPORT):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write("some program output\n" + json.dumps(report) + "\n")
    try:
        done = subprocess.run([sys.executable, os.path.join(HERE, "check_stats.py"), handle.name, *conditions],
                              capture_output=True, text=True, check=False)
    finally:
        os.unlink(handle.name)
    return done.returncode, done.stdout


class CheckStats(unittest.TestCase):
    def test_numbers_are_summed_over_the_devices(self):
        self.assertEqual(check("calls.cudaMalloc==15")[0], 0)
        self.assertEqual(check("calls.cudaMalloc==10")[0], 1)

    def test_one_device_alone(self):
        self.assertEqual(check("device0.calls.cudaMalloc==10", "device1.failures>=1",
                               "device1.bytes.reserved_peak<=67108864", "device0.expandable==1")[0], 0)
        rc, out = check("device1.bytes.reserved_peak>67108864")
        self.assertEqual(rc, 1)
        self.assertIn("device1.bytes.reserved_peak=62914560: FAIL", out)

    def test_a_device_the_report_does_not_list_fails(self):
        rc, out = check("device2.failures==0")
        self.assertEqual(rc, 1)
        self.assertIn("device2.failures=absent: FAIL", out)
        self.assertEqual(check("?device2.failures==0")[0], 0)  # information only

    def test_strings(self):
        self.assertEqual(check("device0.stack==dev0pool", "device1.stack==dev1cap", "device1.stack!=dev0pool")[0], 0)
        self.assertEqual(check("device1.stack==dev0pool")[0], 1)
        self.assertEqual(check("device1.stack>dev0pool")[0], 2)
        # without a device, a string present on several devices is ambiguous: fails
        self.assertEqual(check("stack==dev0pool")[0], 1)

    def test_top_level_and_alternatives(self):
        self.assertEqual(check("rank==1", "invalid_frees==0", "device0.failures>0|device1.failures>0")[0], 0)
        self.assertEqual(check("rank==0")[0], 1)

    def test_a_missing_file_is_status_2(self):
        done = subprocess.run([sys.executable, os.path.join(HERE, "check_stats.py"), "/nonexistent.json", "rank==0"],
                              capture_output=True, text=True, check=False)
        self.assertEqual(done.returncode, 2)


if __name__ == "__main__":
    unittest.main()
