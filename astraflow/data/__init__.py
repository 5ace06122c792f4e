"""Composable data stages: pure functions over Arrow tables, chained in the flow."""
