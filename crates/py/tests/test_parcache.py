"""The Python package as a user runs it (scripts/test.sh runs this file):
the simulator's scenarios, replay and the advisor on a small trace, rows as
a DataFrame, bad input named, and a real cluster read and written through
the client library."""

import os
import subprocess
import sys
import tempfile
import unittest

import parcache

TRACE = "time,node,process,file,op,offset,length\n" + "".join(
    f"{i * 0.01:.2f},a,1,/job/out,write,{i * 65536},65536\n" for i in range(32)
) + "".join(f"{1 + i * 0.01:.2f},b,1,/job/out,read,{i * 65536},65536\n" for i in range(32))


class Simulator(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.trace = os.path.join(self.dir.name, "t.csv")
        with open(self.trace, "w") as f:
            f.write(TRACE)

    def tearDown(self):
        self.dir.cleanup()

    def test_scenarios_are_listed_and_run(self):
        names = [s["name"] for s in parcache.scenarios()]
        self.assertIn("kotz92-table", names)
        out = parcache.run_scenario("kotz92-table", threads=2)
        self.assertTrue(out["rows"] and out["checks"])
        exe = os.environ.get("PARCACHE_BIN")
        if exe:
            # The same numbers as the command line's.
            cli = subprocess.run([exe, "sim", "run", "kotz92-table", "--format", "json"], check=True, capture_output=True)
            import json

            self.assertEqual(json.loads(cli.stdout)["rows"], out["rows"])

    def test_replay_returns_the_outcome(self):
        r = parcache.replay(self.trace, policies={"write": "write-back"})
        self.assertEqual(r["summary"]["nodes"], 2)
        self.assertEqual(r["outcome"]["bytes_written"], 32 * 65536)
        self.assertEqual(r["outcome"]["disk_write_bytes"], 32 * 65536)
        self.assertEqual(r["policies"]["write"], "write-back")
        slow = parcache.replay(self.trace, cluster={"disk_mbps": 10.0, "link_mbps": 10.0})
        fast = parcache.replay(self.trace, cluster={"disk_mbps": 4000.0, "link_mbps": 4000.0})
        self.assertGreater(slow["outcome"]["io_time"], fast["outcome"]["io_time"])

    def test_advise_ranks_and_frames(self):
        a = parcache.advise(self.trace, only={"replacement": "lru", "prefetch": ["none", "one-block-ahead"]}, threads=2)
        self.assertEqual(a["sharing"], {"shared in turn": 1})
        io = [r["outcome"]["io_time"] for r in a["ranked"]]
        self.assertEqual(io, sorted(io))
        self.assertEqual(sum(r["default"] for r in a["ranked"]), 1)
        self.assertNotEqual(a["directories"][0]["policies"]["consistency"], "none")
        again = parcache.advise(self.trace, only={"replacement": "lru", "prefetch": ["none", "one-block-ahead"]}, threads=1)
        self.assertEqual(a, again, "same trace, same answer, whatever the threads")
        df = parcache.frame(a["ranked"])
        self.assertEqual(len(df), len(a["ranked"]))
        for col in ("write", "consistency", "io_time", "disk_write_bytes"):
            self.assertIn(col, df.columns)

    def test_bad_input_is_named(self):
        with self.assertRaisesRegex(ValueError, "sometimes"):
            parcache.replay(self.trace, policies={"write": "sometimes"})
        with self.assertRaisesRegex(ValueError, "no-such-trace"):
            parcache.replay(os.path.join(self.dir.name, "no-such-trace.csv"))
        with self.assertRaisesRegex(ValueError, "disk_mbps"):
            parcache.replay(self.trace, cluster={"disk_mbps": -1.0})
        with self.assertRaisesRegex(ValueError, "colour"):
            parcache.advise(self.trace, only={"colour": "red"})
        with self.assertRaisesRegex(ValueError, "no such scenario|unknown scenario|nope"):
            parcache.run_scenario("nope")


class ClientLibrary(unittest.TestCase):
    """A real cluster (`parcache up`) on loopback, stopped afterwards."""

    def test_write_read_list_and_policies(self):
        exe = os.environ.get("PARCACHE_BIN")
        if not exe:
            self.skipTest("PARCACHE_BIN is not set (scripts/test.sh sets it)")
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "cluster")
            subprocess.run([exe, "up", "--data", data, "--iods", "2"], check=True, capture_output=True)
            try:
                with parcache.Client(data=data) as c:
                    c.mkdir("/py")
                    blob = bytes(range(256)) * 4096
                    c.write("/py/blob", blob)
                    c.write("/py/small", b"abc")
                    c.write("/py/small", b"x")
                    self.assertEqual(c.read("/py/blob"), blob)
                    self.assertEqual(c.read("/py/small"), b"x", "a shorter write truncates")
                    self.assertEqual(sorted(c.listdir("/py")), ["blob", "small"])
                    c.set_policy("/py/blob", "write", "write-back")
                    self.assertEqual(c.policies("/py/blob")["write"], "write-back")
                    c.remove("/py/small")
                    with self.assertRaisesRegex(OSError, "/py/small"):
                        c.read("/py/small")
                # What the client wrote is what the command line reads.
                out = subprocess.run([exe, "cat", "--data", data, "pc:/py/blob"], check=True, capture_output=True)
                self.assertEqual(out.stdout, blob)
                with self.assertRaisesRegex(OSError, "no-cluster"):
                    parcache.Client(data=os.path.join(d, "no-cluster"))
                with self.assertRaises(ValueError):
                    parcache.Client()
            finally:
                subprocess.run([exe, "down", "--data", data], capture_output=True)


if __name__ == "__main__":
    unittest.main(verbosity=2, argv=[sys.argv[0]])
