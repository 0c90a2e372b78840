#!/usr/bin/python3
"""Scale-out by prefix, on loopback: two pruneserve replicas and a router that follows
their SubscribeKvEvents streams. The router computes the page keys of a prompt (the
hash chain of memory/prefix_index.cc, written again here from the proto's description)
and sends it to the replica holding its longest cached prefix, the less used one on a
tie. Repeat documents must land on the replica that first served them, hit its
cache, and both replicas must be used; a late subscriber gets a snapshot; a flush
shows up as removals."""
import argparse
import os
import struct
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from grpcstubs import run_tests  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402

ARGS = None
MASK = (1 << 64) - 1
PAGE = 16  # --kv-block-size's default


def fnv(h, data):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & MASK
    return h


def finish(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
    return z ^ (z >> 31)


def root_key(extra):
    return finish(fnv(fnv(0xcbf29ce484222325, b"root"), extra))


def page_keys(tokens, extra=b"0:0:"):
    """Keys of the prompt's pages a request may reuse (whole pages, at least one token left).
    extra "0:0:": `full` (an empty strategy key) and no salt or API key."""
    keys, parent = [], root_key(extra)
    for p in range((len(tokens) - 1) // PAGE):
        data = struct.pack("<Q", parent) + struct.pack(f"<{PAGE}I", *(t & 0xffffffff
                                                                       for t in tokens[p * PAGE:(p + 1) * PAGE]))
        parent = finish(fnv(0xcbf29ce484222325, data))
        keys.append(parent)
    return keys


class Replica:
    """A server and what its event stream says it caches (key -> medium)."""

    def __init__(self, name):
        self.name = name
        self.server = Server(ARGS.server, ARGS.model)
        self.channel = grpc.insecure_channel(self.server.grpc_addr)
        self.stub = pb_grpc.GenerationStub(self.channel)
        assert wait_for(self.loaded, 60), f"{name} did not load:\n{self.server.read_log()}"
        self.cached, self.batches, self.lock = {}, [], threading.Lock()
        self.sent = 0
        self.events = self.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        self.reader = threading.Thread(target=self.follow, daemon=True)
        self.reader.start()

    def loaded(self):
        try:
            self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=1)
            return True
        except grpc.RpcError:
            return False

    def follow(self):
        try:
            for batch in self.events:
                with self.lock:
                    self.batches.append(batch)
                    apply(self.cached, batch)
        except grpc.RpcError:
            pass  # cancelled at the end

    def holds(self, keys):
        with self.lock:
            return all(k in self.cached for k in keys)

    def prefix_score(self, keys):
        with self.lock:
            n = 0
            while n < len(keys) and keys[n] in self.cached:
                n += 1
            return n

    def generate(self, tokens):
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=tokens), sampling=pb.SamplingParams(temperature=0.0),
                                 stopping=pb.StoppingCriteria(max_new_tokens=4, ignore_eos=True))
        events = list(self.stub.Generate(req, timeout=60))
        self.sent += 1
        return events[-1].finished.usage

    def close(self):
        self.events.cancel()
        self.channel.close()
        code, log = self.server.stop()
        assert code == 0, f"{self.name} exited with {code}:\n{log}"


def apply(cached, batch):
    for ev in batch.events:
        if ev.HasField("stored"):
            for k in ev.stored.block_hashes:
                cached[k] = ev.stored.medium
        else:
            for k in ev.removed.block_hashes:
                if cached.get(k) == ev.removed.medium:
                    del cached[k]


def document(d):
    return [1] + [260 + (d * 41 + k * 13) % 250 for k in range(120)]


def question(d, q):
    return document(d) + [300 + (q * 17 + k * 5) % 200 for k in range(6)]


class PrefixRoutingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.replicas = [Replica("a"), Replica("b")]

    @classmethod
    def tearDownClass(cls):
        for r in cls.replicas:
            r.close()

    def route(self, tokens):
        keys = page_keys(tokens)
        return max(self.replicas, key=lambda r: (r.prefix_score(keys), -r.sent))

    def test_1_repeat_documents_land_on_the_replica_that_holds_them(self):
        first_home, hits = {}, 0
        for q in range(3):
            for d in range(3):
                tokens = question(d, q)
                replica = self.route(tokens)
                usage = replica.generate(tokens)
                if q == 0:
                    first_home[d] = replica.name
                    self.assertEqual(usage.cached_tokens, 0)
                else:
                    self.assertEqual(replica.name, first_home[d], f"document {d}, question {q}")
                    self.assertEqual(usage.cached_tokens, (len(tokens) - 1) // PAGE * PAGE)
                    hits += 1
                # The replica's events name the pages it now caches, under the keys computed here.
                self.assertTrue(wait_for(lambda: replica.holds(page_keys(tokens)), 10), (d, q))
        self.assertEqual(hits, 6)
        self.assertEqual(set(first_home.values()), {"a", "b"}, "ties go to the less used replica")
        for r in self.replicas:
            with r.lock:
                self.assertTrue(r.batches[0].snapshot)
                self.assertEqual([b.sequence for b in r.batches], list(range(len(r.batches))))
                stored = [ev.stored for b in r.batches for ev in b.events if ev.HasField("stored")]
            self.assertTrue(all(s.block_size == PAGE and s.medium == "device" for s in stored))
            self.assertTrue(all(len(s.token_ids) == PAGE * len(s.block_hashes) for s in stored))

    def test_2_a_late_subscriber_gets_a_snapshot_and_a_flush_removes_everything(self):
        a = self.replicas[0]
        if not a.cached:  # alone: test_1 leaves pages on both replicas
            a.generate(question(0, 0))
            self.assertTrue(wait_for(lambda: a.holds(page_keys(question(0, 0))), 10))
        late = a.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest(), timeout=30)
        snapshot = next(late)
        self.assertTrue(snapshot.snapshot)
        self.assertEqual(snapshot.sequence, 0)
        seen = {}
        apply(seen, snapshot)

        def same():
            with a.lock:
                return seen == a.cached
        self.assertTrue(wait_for(same, 10), "the snapshot is what the first stream built")
        late.cancel()
        a.stub.FlushCache(pb.FlushCacheRequest(), timeout=10)
        self.assertTrue(wait_for(lambda: not a.cached, 10), "the flush's removals")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--proto-dir", required=True)
    ARGS, rest = ap.parse_known_args()
    run_tests(ARGS.proto_dir, [sys.argv[0]] + rest, globals())
