"""neuron-ls's output in each layout the Neuron docs show, for tests of trnlab's reading of it; each says where it is from.
Neuron 2.34's layouts (``--output-format json``, and its text table) were not found in the docs: none is here."""

import json

# neuron-ls as the Neuron docs print it on a trn2n.48xlarge (devices 0 and 1 of 16 kept; the rest as printed).
# The 2.21 beta layout: no header lines, NEURON CORES physical beside LOGICAL NC. `neuron-ls --show-all-procs`,
# https://awsdocs-neuron.readthedocs-hosted.com/en/v2.21.0.beta/tools/neuron-sys-tools/neuron-ls.html
# (aws-neuron/aws-neuron-sdk, tools/neuron-sys-tools/neuron-ls.rst at 2086a70a, "Neuron SDK Release 2.21.0 Beta").
NEURON_LS_2_21_BETA = """\
+--------+--------+---------+--------+---------------+---------+--------+------------------------------------------+---------+
| NEURON | NEURON | LOGICAL | NEURON |   CONNECTED   |   PCI   |  PID   |                 COMMAND                  | RUNTIME |
| DEVICE | CORES  |   NC    | MEMORY |    DEVICES    |   BDF   |        |                                          | VERSION |
+--------+--------+---------+--------+---------------+---------+--------+------------------------------------------+---------+
| 0      | 8      | 4       | 96 GB  | 12, 3, 4, 1   | cc:00.0 | 268911 | neuron-bench exec --run-as-cc-neff --... | 2.0.0   |
|        |        |         |        |               |         | 269192 | neuron-ls --show-all-procs               | NA      |
+--------+--------+---------+--------+---------------+---------+--------+------------------------------------------+---------+
| 1      | 8      | 4       | 96 GB  | 13, 0, 5, 2   | b5:00.0 | 268911 | neuron-bench exec --run-as-cc-neff --... | 2.0.0   |
|        |        |         |        |               |         | 269192 | neuron-ls --show-all-procs               | NA      |
+--------+--------+---------+--------+---------------+---------+--------+------------------------------------------+---------+
"""
# The layout up to 2.33 (the JSON flag -j is still there; Neuron 2.34 removed it): header lines, NEURON CORES
# logical at the header's LNC, NEURON CORE IDS (2.25 on), and no process column in the plain table. `neuron-ls` and
# `neuron-ls -j` (the page elides devices 1-14 with "..."), aws-neuron/aws-neuron-sdk, tools/neuron-sys-tools/
# neuron-ls.rst at 81ce03ae (the Neuron 2.32 docs, August 2026); the same on
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/neuron-ls.html as stored before 2.34.
NEURON_LS_2_33 = """\
instance-type: trn2n.48xlarge
instance-id: i-aabbccdd123456789
logical-neuroncore-config: 2
+--------+--------+----------+--------+---------------+--------------+---------------+------+
| NEURON | NEURON |  NEURON  | NEURON |   CONNECTED   |     PCI      |      CPU      | NUMA |
| DEVICE | CORES  | CORE IDS | MEMORY |    DEVICES    |     BDF      |   AFFINITY    | NODE |
+--------+--------+----------+--------+---------------+--------------+---------------+------+
| 0      | 4      | 0-3      | 96 GB  | 12, 3, 4, 1   | 0000:cc:00.0 | 48-95,144-191 | 1    |
| 1      | 4      | 4-7      | 96 GB  | 13, 0, 5, 2   | 0000:b5:00.0 | 48-95,144-191 | 1    |
+--------+--------+----------+--------+---------------+--------------+---------------+------+
"""
NEURON_LS_2_33_JSON = json.dumps([
    {"neuron_device": device, "bdf": bdf, "cpu_affinity": "48-95,144-191", "numa_node": "1", "connected_to": links,
     "nc_count": 4, "logical_neuroncore_config": 2, "memory_size": 103079215104, "neuroncore_ids": ids,
     "neuron_processes": [{"pid": 113985, "command": "neuron-bench exec --run-as-cc-neff --...",
                           "neuron_runtime_version": "2.0.0"}]}
    for device, bdf, links, ids in ((0, "cc:00.0", [12, 3, 4, 1], [0, 1, 2, 3]),
                                    (15, "f7:00.0", [11, 14, 3, 12], [60, 61, 62, 63]))], indent=4)
