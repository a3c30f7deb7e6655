"""View definitions shared by the batch and the speed layer (View = Query(Data))."""
