"""The admin API under /admin/v1: keys, subjects' budgets and usage reports, every action audited."""
