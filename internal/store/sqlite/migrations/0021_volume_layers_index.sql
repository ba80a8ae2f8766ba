-- Whether any volume names a layer in its record (UnheldLayers, on the
-- delete of a layer's last holder) reads the volumes that have layers
-- only: copies and the volumes they were made of.
CREATE INDEX volumes_layered ON volumes (id) WHERE layers_json != '';
