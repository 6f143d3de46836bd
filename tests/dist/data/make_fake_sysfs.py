#!/usr/bin/env python3
"""Writes the fake sysfs trees under tests/dist/data/ used by the topology tests (run it from anywhere; the
trees are checked in, so this only needs rerunning after a change). Each tree has what topology discovery reads:
/sys/bus/pci/devices/<busid> symlinks into /sys/devices/pci<domain:bus>/..., numa_node and max_link_* files,
/sys/devices/system/node/node*/cpulist and /sys/class/net/*/{operstate,speed}."""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def device(root, chain, numa, speed="16.0 GT/s PCIe", width=16):
    """chain: [root complex 'pci0000:16', root port, ..., device]; writes every device's files and the
    bus/pci/devices symlink for each."""
    path = os.path.join(root, "devices", chain[0])
    for busid in chain[1:]:
        path = os.path.join(path, busid)
        write(os.path.join(path, "numa_node"), str(numa))
        write(os.path.join(path, "max_link_speed"), speed)
        write(os.path.join(path, "max_link_width"), str(width))
        link = os.path.join(root, "bus", "pci", "devices", busid)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.islink(link):
            os.symlink(os.path.relpath(path, os.path.dirname(link)), link)


def common(root, nodes, nic_mbps):
    for i, cpus in enumerate(nodes):
        write(os.path.join(root, "devices", "system", "node", f"node{i}", "cpulist"), cpus)
    write(os.path.join(root, "class", "net", "lo", "operstate"), "unknown")
    write(os.path.join(root, "class", "net", "eth0", "operstate"), "up")
    write(os.path.join(root, "class", "net", "eth0", "speed"), str(nic_mbps))


def dual_socket_8gpu():
    """Two sockets, two PCIe 4.0 switches per socket, two GPUs per switch (8 GPUs)."""
    root = os.path.join(HERE, "sysfs_dual_socket_8gpu")
    shutil.rmtree(root, ignore_errors=True)
    common(root, ["0-15", "16-31"], 100000)
    for numa, buses in [(0, [0x16, 0x38]), (1, [0x97, 0xb7])]:
        for b in buses:
            rc, rp, up = f"pci0000:{b:02x}", f"0000:{b:02x}:02.0", f"0000:{b + 1:02x}:00.0"
            for k in range(2):
                down, gpu = f"0000:{b + 2:02x}:0{k}.0", f"0000:{b + 3 + k:02x}:00.0"
                device(root, [rc, rp, up, down, gpu], numa)


def pcie_4090():
    """One socket, four GPUs each on its own root port (no switch), the PCIe 4.0 x16 links of an RTX 4090 box,
    and a fifth device behind a single bridge."""
    root = os.path.join(HERE, "sysfs_4090_box")
    shutil.rmtree(root, ignore_errors=True)
    common(root, ["0-31"], 10000)
    for k, b in enumerate([0x01, 0x21, 0x41, 0x61]):
        device(root, ["pci0000:00", f"0000:00:0{k + 1}.0", f"0000:{b:02x}:00.0"], -1)
    device(root, ["pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:00.0"], -1, "8.0 GT/s PCIe", 8)


if __name__ == "__main__":
    dual_socket_8gpu()
    pcie_4090()
