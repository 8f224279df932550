"""Keeps a running loss as a tensor (`running_loss += loss`) across the whole epoch."""
# expect: graph_kept_alive

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    for epoch in range(epochs):
        model.train()
        running_loss = 0
        for inputs, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss
        model.eval()
        with torch.no_grad():
            for inputs, labels in val_loader:
                model(inputs.to(device))
        print(f"[{epoch}] loss: {running_loss / len(train_loader):.3f}")
