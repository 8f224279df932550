"""ReduceLROnPlateau on the validation loss and early stopping with patience, `for`/`else` style."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)
    best, bad_epochs = float("inf"), 0
    for epoch in range(epochs):
        model.train()
        for inputs, labels in train_loader:
            for p in model.parameters():
                p.grad = None
            outputs = model(inputs.to(device))
            loss_fn(outputs, labels.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            losses = [loss_fn(model(i.to(device)), lab.to(device)).item() for i, lab in val_loader]
        val_loss = sum(losses) / len(losses)
        plateau.step(val_loss)
        if val_loss < best - 1e-4:
            best, bad_epochs = val_loss, 0
        else:
            bad_epochs += 1
            if bad_epochs > 3:
                break
    return epoch
