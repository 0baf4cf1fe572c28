"""Templates of the made-up ``widget-backend`` plugin kind (declared by ``acme_widgets``)."""
