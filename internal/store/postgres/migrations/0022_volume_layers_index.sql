-- Whether any volume names a layer in its record (UnheldLayers, on the
-- delete of a layer's last holder) is an index probe, not a scan of every
-- volume.
CREATE INDEX volumes_layers ON volumes USING gin (layers);
