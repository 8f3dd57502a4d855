"""Results: the store of campaigns and runs, and the reports and notifications made from it."""
