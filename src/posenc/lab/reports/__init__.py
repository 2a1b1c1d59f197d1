"""The lab's last stage: results. Rows as dataclasses and their one reader, the tables, CSV and
README blocks of a grid and of ``posenc lab extend``, paired comparisons and intervals over
seeds."""
