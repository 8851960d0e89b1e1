"""Procedural HPE and BMR scenario engine writing M3ED, NYUv2 and KITTI formats."""
